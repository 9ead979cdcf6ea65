"""Adapters that fold K sampled action paths into one plan vector per sentence (section 3.3).

Letters: N sentences (flattened, one plan each), K paths, T horizon (steps per path), A actions,
E action-embedding width, D the LM's width (hidden_size).

Every adapter maps ``action_paths (N, K, T) long, path_mask (N, K, T) bool -> plan_embeds (N, D)``.
``path_mask`` is True for real steps (a path is cut where the article ends for oracle actions).
Plans in expectation (beyond the paper; ``PlanConfig.expectation``) give each step as a distribution instead:
``action_paths (N, K, T, M)`` its M most likely actions, ``action_probs (N, K, T, M)`` their probabilities; the
step's embedding is then the expected one, sum_m p_m Emb(a_m) (``step_embeddings``), everywhere the
formulas below read Emb(a_t^j), PT's input included (M letters the actions of a step).

An adapter is an ``Adapter`` subclass: it implements ``forward`` (and ``check``, ``alphas``, ``gated_parameters``
where it has them) and names its config dataclass (``config_class``: ``AdapterConfig``, the sizes, or a subclass
with fields of its own, as ``MultiPathConfig``), so a saved config holds only the fields its kind reads.
``AdapterConfig.kind`` (``--adapter.kind``) names it by its import path (``my_package.module:ClassName``, imported
where it is used) or by the ``name`` it is registered under (``register_adapter``, as the built-ins are);
``build_adapter`` builds it, and a saved model records the kind in its planned_lm.json (a class of your own by its
import path) and is rebuilt from it when loaded (docs/extending.md adds one). Built in:

``project_avg`` (the paper's "Project and Avg"; with T = K = 1 the Cornille et al. adapter)::

    c_t^j   = W Emb(a_t^j) + b                       per step, (N, K, T, D)
    c~^j    = mean over the valid steps t of c_t^j   per path, (N, K, D)
    c^      = mean over the valid paths j of c~^j    (N, D)

``multipath`` (equations 1 and 2 of the paper)::

    c^j = PT(U Emb(a)_{1:T}^j + p_{1:T}) * alpha_1 + c~^j     (eq. 1; U = identity when E = D)
    c   = ST(c^1, ..., c^K) * alpha_2 + c^                   (eq. 2)

Design decisions the paper leaves open, made here:

- The PathTransformer reads the action embeddings themselves, as in eq. 1: its input is
  U Emb(a_t^j) + p_t, with U the identity when the action width E equals the LM width D (the
  paper's case, 768 = 768) and otherwise a randomly initialised linear map E -> D (never zero),
  plus learned absolute position embeddings p_1..p_T (D wide, initialised at the scale of U Emb, so
  the order of a path is as audible as its actions). So PT sees which actions a path holds
  from the first step, not only the positions. Its output is pooled into one vector per path by a
  masked mean over the valid steps; with alpha_1 = 0 the path vector is exactly the Project-and-Avg
  c~^j.
- The SampleTransformer runs at width D over the K path vectors c^j of eq. 1, without position
  embeddings (the paths are an unordered sample), and is pooled by a masked mean over the valid paths.
  At the very first step (W = 0, alpha_1 = 0) its inputs are c~^j = 0; W has a gradient at once, so
  from the first update on they are the Project-and-Avg path vectors (its pre-norm LayerNorm reads
  their direction whatever their scale), and PT's informative output joins them once alpha_1 moves.
- Both are bidirectional ``nn.TransformerEncoder`` stacks (pre-norm, GELU, feed-forward 2 D).
- Each distinct path of a batch goes through the PathTransformer once (oracle and argmax plans
  repeat one path K times); results do not depend on the batch (tested).
- With the ReZero scalars at zero, alpha_2 gets a gradient at once and alpha_1 once alpha_2 has
  moved (eq. 2 adds c^, the mean of c~^j, so at alpha_2 = 0 the path vectors c^j do not reach c).
  ``alphas()`` returns their values (written to the model's manifest and the report).
- While the scalars are near zero, PT and ST receive a near-zero, mostly noisy gradient that Adam turns
  into full-size random steps; ``gated_parameters()`` names them so that training can give them a smaller
  learning rate (``train.multipath_lr_scale``; see docs/results.md).
- ``rezero=False`` (the paper's "no ReZero" ablation) drops both scalars *and* both skip connections
  to the Project-and-Avg solution: c^j = PT(U Emb(a)_{1:T}^j + p_{1:T}), c = ST(c^1, ..., c^K): a
  plain stack of two transformers on the action embeddings, which does not start as a no-op.
- W and b start at zero, so a fresh adapter with ReZero returns c = 0 and the conditioned LM starts exactly as
  the base LM (the gradient with respect to W is not zero, so it learns from the first step).
- The action embedding table Emb starts as the k-means centroids (A, E): E is the codebook's width.
- PT and ST have no dropout; their layers start at PyTorch's init.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import ClassVar, Optional

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from planlm.errors import PlanlmError
from planlm.plugins import PluginImportError, import_path_of, is_import_path, named_or_imported

ADAPTER_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]


SIZES = ("num_actions", "action_dim", "hidden_size", "horizon")
"""The fields of every adapter config that the data and the LM give (A, E, D, T), never the user."""
MULTIPATH_FIELDS = ("num_layers", "num_heads", "dim_feedforward", "rezero")
"""The multipath adapter's settings. Older saved configs hold them for every kind, and settings shared by conditions
of several kinds may set them: a kind whose config has no such field ignores it."""


@dataclass
class AdapterSettings:
    """The adapter as a user chooses it (``train-lm --adapter.*``): its kind and the fields of the kind's own config
    (``AdapterConfig`` and its subclasses); its sizes come from the data and the LM."""

    kind: str = "project_avg"
    """project_avg (Project and Avg), multipath (PathTransformer + SampleTransformer + ReZero), a registered adapter,
    or an Adapter class of your own by its import path (my_package.module:ClassName; docs/extending.md)."""
    num_layers: Optional[int] = None
    """multipath: layers of the PathTransformer and of the SampleTransformer (default 1)."""
    num_heads: Optional[int] = None
    """multipath: attention heads of both transformers (must divide the LM width; default 2)."""
    dim_feedforward: Optional[int] = None
    """multipath: feed-forward width of both transformers (default: 2 x the LM width)."""
    rezero: Optional[bool] = None
    """multipath: ReZero scalars alpha_1, alpha_2 (init 0) around Project-and-Avg (default true); false = the paper's
    ablation."""
    options: Optional[dict] = None
    """Fields of the kind's own config class (Adapter.config_class) by name, for an adapter of your own, e.g.
    {gate_init: 0.5}."""

    def __post_init__(self):
        self.kind = adapter_kind(adapter_class(self.kind), self.kind)  # one-line error naming the adapters
        self.fields()  # one-line errors for options the kind's config does not have

    def fields(self) -> dict:
        """The fields of the kind's config that these settings set (the multipath ones where the kind has them)."""
        config_class = adapter_class(self.kind).config_class
        names = _field_names(config_class)
        values = {name: getattr(self, name) for name in MULTIPATH_FIELDS
                  if getattr(self, name) is not None and name in names}
        options = dict(self.options or {})
        settable = sorted(names - {"kind", *SIZES})
        unknown = sorted(set(options) - set(settable))
        if unknown:
            raise PlanlmError(f"--adapter.options {unknown}: adapter {self.kind} ({config_class.__name__}) has no such "
                              f"setting; it takes {settable or 'none'}")
        twice = sorted(set(options) & set(values))
        if twice:
            raise PlanlmError(f"--adapter.options {twice}: set each of them once, as --adapter.<name> or in "
                              f"--adapter.options")
        return {**values, **{name: _typed(config_class, name, value) for name, value in options.items()}}

    def reuse_key(self) -> dict:
        """The settings as a run's reuse key holds them: the shape of the one settings class of earlier releases (the
        multipath fields at their defaults when unset), so that finished runs stay valid, and the options when set."""
        key = {"kind": self.kind, "num_layers": 1 if self.num_layers is None else self.num_layers,
               "num_heads": 2 if self.num_heads is None else self.num_heads, "dim_feedforward": self.dim_feedforward,
               "rezero": True if self.rezero is None else self.rezero}
        return {**key, "options": dict(self.options)} if self.options else key


class _ConfigOfKind(type):
    """``AdapterConfig(kind=..., ...)`` builds the kind's own config class (``Adapter.config_class``); a multipath
    field that the class lacks is ignored (older saved configs hold them for every kind), any other unknown field
    is a one-line error."""

    def __call__(cls, *args, **kwargs):
        target = cls
        if cls is AdapterConfig and (args or "kind" in kwargs):
            target = adapter_class(kwargs["kind"] if "kind" in kwargs else args[0]).config_class
        names = _field_names(target)
        unknown = sorted(set(kwargs) - names - set(MULTIPATH_FIELDS))
        if unknown:
            raise PlanlmError(f"adapter {kwargs.get('kind', args[0] if args else target.kind)}: {target.__name__} has "
                              f"no field(s) {unknown}; its fields are {sorted(names)}")
        return super(_ConfigOfKind, target).__call__(*args, **{k: v for k, v in kwargs.items() if k in names})


@dataclass
class AdapterConfig(metaclass=_ConfigOfKind):
    """The whole shape of an adapter, as a saved model records it (planned_lm.json): its kind, the sizes of its
    actions, its LM and its paths, and the fields of the kind's own config class, a subclass (``MultiPathConfig``,
    or your adapter's ``config_class``). ``AdapterConfig(kind=...)`` builds the kind's own class, so a saved config
    holds only the fields its kind reads."""

    kind: str = "project_avg"
    """The adapter: a registered name (project_avg, multipath) or an Adapter class's import path."""
    action_dim: int = 768
    """E: width of the action embedding table (the codebook's width)."""
    num_actions: int = 1024
    """A: size of the action vocabulary (codebook rows)."""
    hidden_size: int = 768
    """D: the LM's embedding width; plan vectors are added to token embeddings."""
    horizon: int = 10
    """Longest path T the adapter accepts (number of position embeddings p_1..p_T)."""

    @classmethod
    def of(cls, settings: AdapterSettings, *, num_actions: int, codebook_width: int, hidden_size: int,
           horizon: int) -> AdapterConfig:
        """The config of ``settings`` for a codebook of ``num_actions`` x ``codebook_width``, an LM of width
        ``hidden_size`` and paths of ``horizon`` steps."""
        return AdapterConfig(kind=settings.kind, **settings.fields(), action_dim=codebook_width,
                             num_actions=num_actions, hidden_size=hidden_size, horizon=horizon)

    def __post_init__(self):
        cls = adapter_class(self.kind)  # one-line error naming the adapters
        self.kind = adapter_kind(cls, self.kind)
        if not isinstance(self, cls.config_class):
            raise PlanlmError(f"adapter {self.kind} reads a {cls.config_class.__name__}, not a {type(self).__name__}; "
                              f"build it as AdapterConfig(kind={self.kind!r}, ...)")
        for name in SIZES:
            if getattr(self, name) < 1:
                raise PlanlmError(f"adapter {name} must be >= 1 (got {getattr(self, name)})")
        cls.check(self)


@dataclass
class MultiPathConfig(AdapterConfig):
    """The multipath adapter's config: the sizes plus its two transformers' shape and the ReZero switch."""

    kind: str = "multipath"
    num_layers: int = 1
    """Layers of the PathTransformer and of the SampleTransformer."""
    num_heads: int = 2
    """Attention heads of both transformers (must divide the LM width)."""
    dim_feedforward: Optional[int] = None
    """Feed-forward width of both transformers (None: 2 x the LM width)."""
    rezero: bool = True
    """ReZero scalars alpha_1, alpha_2 (init 0) around Project-and-Avg; False = the paper's ablation."""


def _field_names(config_class: type) -> set[str]:
    return {f.name for f in dataclass_fields(config_class)}


def _typed(config_class: type, name: str, value):
    """An option as its field's type reads it: a command-line value arrives as text (``--adapter.options.x 0.5``)."""
    if not isinstance(value, str):
        return value
    try:
        hint = typing.get_type_hints(config_class).get(name)
    except Exception:  # an annotation this module cannot resolve: the value as given
        return value
    if hint is str or str in typing.get_args(hint):
        return value
    import yaml

    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def gather_rows(table: Tensor, index: Tensor) -> Tensor:
    """``table[index]`` with a reproducible backward: table (R, D), index (...) in [0, R) -> (..., D).

    The backward of advanced indexing on CPU adds repeated rows with parallel atomic adds, in an order
    that changes from run to run (trained weights then differ at about 1e-7 between two runs of one
    config); the embedding backward sums them in a fixed order."""
    return torch.nn.functional.embedding(index, table)


def masked_mean(values: Tensor, mask: Tensor, dim: int) -> Tensor:
    """Mean of ``values`` over ``dim`` where ``mask`` is True; 0 where nothing is valid.

    values (..., M, D) with dim the M axis, mask (..., M) bool."""
    weights = mask.to(values.dtype).unsqueeze(-1)  # (..., M, 1)
    total = (values * weights).sum(dim)
    count = weights.sum(dim).clamp(min=1.0)
    return total / count


def _encoder(config: MultiPathConfig) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(
        d_model=config.hidden_size, nhead=config.num_heads,
        dim_feedforward=config.dim_feedforward or 2 * config.hidden_size, dropout=0.0,
        activation="gelu", batch_first=True, norm_first=True)
    # enable_nested_tensor=False: the padded fast path would change results between train and eval.
    return nn.TransformerEncoder(layer, config.num_layers, enable_nested_tensor=False)


class Adapter(nn.Module):
    """One kind of adapter: ``forward(action_paths, path_mask, action_probs) -> (N, D)`` plan vectors, one per
    sentence, added to the token embeddings of its sentence. A subclass sets ``name``, builds its modules from
    ``config`` (its ``config_class``: the sizes A, E, D, T and the fields of its own) in ``__init__`` (``codebook``:
    the (A, E) k-means centroids, for an embedding table initialised from them) and implements ``forward``; a fresh
    one should be a no-op (zero plan vectors, the LM unchanged) so that conditioning starts from the base LM.
    ``--adapter.kind`` names it by its import path (``my_package.module:ClassName``), or by ``name`` once
    ``register_adapter`` has added it."""

    name: str = ""
    config_class: ClassVar[type[AdapterConfig]] = AdapterConfig
    """The dataclass of this adapter's config: ``AdapterConfig`` (the sizes alone) or a subclass with its own fields
    (``--adapter.options`` sets them; a saved model records them in planned_lm.json)."""

    def __init__(self, config: AdapterConfig, codebook: Tensor | None = None):
        super().__init__()
        self.config = config

    @classmethod
    def check(cls, config: AdapterConfig) -> None:
        """One-line errors for settings this adapter cannot serve (called when a config of its kind is made)."""

    def alphas(self) -> dict[str, float] | None:
        """Learned gate scalars to report (written to the model's manifest and the report); None: none."""
        return None

    def gated_parameters(self) -> list[nn.Parameter]:
        """The parameters behind gates (trained at ``train.multipath_lr_scale`` of the adapter's rate)."""
        return []

    def forward(self, action_paths: Tensor, path_mask: Tensor | None = None,
                action_probs: Tensor | None = None) -> Tensor:
        """action_paths (N, K, T) long, path_mask (N, K, T) bool (None: all valid); in expectation action_paths and
        action_probs (N, K, T, M) -> plan vectors (N, D)."""
        raise NotImplementedError


class ProjectAvg(Adapter):
    """c = W Emb(a) + b, averaged over the valid steps of each path, then over the valid paths."""

    name = "project_avg"

    def __init__(self, config: AdapterConfig, codebook: Tensor | None = None):
        super().__init__(config, codebook)
        self.action_embedding = nn.Embedding(config.num_actions, config.action_dim)  # Emb
        self.projection = nn.Linear(config.action_dim, config.hidden_size)  # W, b
        self.reset_parameters(codebook)

    def reset_parameters(self, codebook: Tensor | None = None) -> None:
        if codebook is not None:
            if tuple(codebook.shape) != (self.config.num_actions, self.config.action_dim):
                raise PlanlmError(
                    f"codebook of shape {tuple(codebook.shape)} cannot initialise an action embedding of "
                    f"({self.config.num_actions}, {self.config.action_dim}); give the codebook the adapter was "
                    f"built for")
            with torch.no_grad():
                self.action_embedding.weight.copy_(codebook)
        nn.init.zeros_(self.projection.weight)  # a fresh adapter is a no-op
        nn.init.zeros_(self.projection.bias)

    def step_embeddings(self, action_paths: Tensor, action_probs: Tensor | None = None) -> Tensor:
        """Emb(a) of every step: action_paths (..., T) long -> (..., T, E); in expectation, action_paths and
        action_probs (..., T, M) -> sum_m p_m Emb(a_m) (..., T, E), without building the (..., T, M, E) terms."""
        if action_probs is None:
            return self.action_embedding(action_paths)
        num_actions = action_paths.shape[-1]
        bags = torch.nn.functional.embedding_bag(
            action_paths.reshape(-1, num_actions), self.action_embedding.weight, mode="sum",
            per_sample_weights=action_probs.reshape(-1, num_actions).to(self.action_embedding.weight.dtype))
        return bags.view(*action_paths.shape[:-1], -1)  # (..., T, E)

    def forward(self, action_paths: Tensor, path_mask: Tensor | None = None,
                action_probs: Tensor | None = None) -> Tensor:
        path_mask = _default_mask(action_paths, path_mask, action_probs)
        path_valid = path_mask.any(-1)  # (N, K)
        # W and b are linear: averaging Emb before projecting gives the same c^, T*K times cheaper.
        mean_embedding = masked_mean(self.step_embeddings(action_paths, action_probs), path_mask, dim=-2)  # (N, K, E)
        mean_embedding = masked_mean(mean_embedding, path_valid, dim=-2)  # e (N, E)
        return self.projection(mean_embedding)  # (N, D)


class MultiPath(ProjectAvg):
    """PathTransformer + SampleTransformer with ReZero around the Project-and-Avg solution (eqs. 1-2).

    Shares ``action_embedding`` and ``projection`` with ``ProjectAvg`` (same parameter names), so a
    ProjectAvg state dict loads into it with ``strict=False``."""

    name = "multipath"
    config_class = MultiPathConfig

    @classmethod
    def check(cls, config: MultiPathConfig) -> None:
        for field in ("num_layers", "num_heads"):
            if getattr(config, field) < 1:
                raise PlanlmError(f"adapter {field} must be >= 1 (got {getattr(config, field)})")
        if config.hidden_size % config.num_heads:
            raise PlanlmError(f"--adapter.num_heads {config.num_heads} must divide the LM width {config.hidden_size}")

    def __init__(self, config: MultiPathConfig, codebook: Tensor | None = None):
        nn.Module.__init__(self)
        self.config = config
        self.action_embedding = nn.Embedding(config.num_actions, config.action_dim)
        self.projection = nn.Linear(config.action_dim, config.hidden_size)
        # U: PT reads the action embeddings (eq. 1); a map E -> D only when the widths differ, never zero.
        self.path_input = (nn.Identity() if config.action_dim == config.hidden_size
                           else nn.Linear(config.action_dim, config.hidden_size))
        self.step_position = nn.Embedding(config.horizon, config.hidden_size)  # p_1..p_T
        self.path_transformer = _encoder(config)  # PT
        self.sample_transformer = _encoder(config)  # ST
        if config.rezero:
            self.alpha_path = nn.Parameter(torch.zeros(()))  # alpha_1
            self.alpha_sample = nn.Parameter(torch.zeros(()))  # alpha_2
        self.reset_parameters(codebook)

    def reset_parameters(self, codebook: Tensor | None = None) -> None:
        super().reset_parameters(codebook)
        # p at the scale of the action inputs: PT reads the order of a path from the start, whatever E is.
        with torch.no_grad():
            scale = self.path_input(self.action_embedding.weight).std().clamp(min=1e-3)
        nn.init.normal_(self.step_position.weight, std=float(scale))

    def alphas(self) -> dict[str, float] | None:
        """The ReZero scalars {alpha_1, alpha_2} (None for the no-ReZero ablation)."""
        if not self.config.rezero:
            return None
        return {"alpha_1": float(self.alpha_path.detach()), "alpha_2": float(self.alpha_sample.detach())}

    def gated_parameters(self) -> list[nn.Parameter]:
        """The PathTransformer's and SampleTransformer's weights (none for the no-ReZero ablation, whose
        transformers are the whole adapter; the ReZero scalars themselves are not among them).

        While alpha_1 and alpha_2 are near zero, the gradient that reaches PT and ST is near zero and mostly
        noise, which Adam scales up to full-size steps: the transformers drift at random, and a gate opens in
        some seeds and not in others. A smaller rate for them (``train.multipath_lr_scale``) lets the gates open
        reliably (see docs/results.md)."""
        if not self.config.rezero:
            return []
        return [*self.path_transformer.parameters(), *self.sample_transformer.parameters()]

    def forward(self, action_paths: Tensor, path_mask: Tensor | None = None,
                action_probs: Tensor | None = None) -> Tensor:
        # PT and ST attend over T steps and K paths (short sequences): flash attention where the head
        # width allows it, else the plain math kernel. The memory-efficient kernel, chosen otherwise for
        # heads over 256 wide (GPT-2 small with 2 heads: 384), has a slow backward pass at these short lengths
        # (see docs/benchmarks.md).
        with sdpa_kernel(ADAPTER_ATTENTION):
            return self._forward(action_paths, path_mask, action_probs)

    def _forward(self, action_paths: Tensor, path_mask: Tensor | None, action_probs: Tensor | None) -> Tensor:
        path_mask = _default_mask(action_paths, path_mask, action_probs)
        num_sentences, num_paths, horizon = path_mask.shape
        if horizon > self.config.horizon:
            raise PlanlmError(f"paths of horizon {horizon} exceed the adapter's horizon {self.config.horizon}")
        path_valid = path_mask.any(-1)  # (N, K)

        # A path's vector depends only on its valid actions, so each distinct path is encoded once
        # (oracle / argmax plans repeat one path K times; confident planners repeat paths too). Under
        # torch.compile every path is encoded: the number of distinct paths, and whether any step is padding,
        # are known only on the host, and asking would break the graph.
        compiling = torch.compiler.is_compiling()
        unique_paths, unique_probs, path_of = _unique_paths(action_paths, path_mask, action_probs,
                                                            distinct=not compiling)  # (U, T[, M])
        step_mask = (unique_paths if unique_probs is None else unique_paths[..., 0]) >= 0  # (U, T)
        embeds = self.step_embeddings(unique_paths.clamp(min=0), unique_probs)  # Emb(a_t^j) (U, T, E)
        # W, b are linear: project the mean embedding, T times cheaper than projecting every step.
        path_avg = self.projection(masked_mean(embeds, step_mask, dim=-2))  # c~^j (U, D)

        # PathTransformer. A path with no valid step attends to all its (padding) steps instead of
        # none (which would give NaN); such paths are dropped by path_valid below.
        step_mask = step_mask | ~step_mask.any(-1, keepdim=True)  # (U, T)
        tokens = self.path_input(embeds) + self.step_position.weight[:horizon]  # U Emb(a) + p (U, T, D)
        # no mask: the fast attention kernels
        padding = ~step_mask if compiling or not bool(step_mask.all()) else None
        path_out = self.path_transformer(tokens, src_key_padding_mask=padding)  # (U, T, D)
        path_out = masked_mean(path_out, step_mask, dim=-2)  # (U, D)

        if self.config.rezero:
            path_vectors = path_out * self.alpha_path + path_avg  # c^j, eq. 1 (U, D)
        else:
            path_vectors = path_out
        path_vectors = gather_rows(path_vectors, path_of).view(num_sentences, num_paths, -1)  # (N, K, D)
        path_avgs = gather_rows(path_avg, path_of).view(num_sentences, num_paths, -1)  # (N, K, D)
        sample_avg = masked_mean(path_avgs, path_valid, dim=-2)  # c^ (N, D)

        sample_mask = path_valid | ~path_valid.any(-1, keepdim=True)  # (N, K), same NaN guard as above
        padding = ~sample_mask if compiling or not bool(sample_mask.all()) else None
        sample_out = self.sample_transformer(path_vectors, src_key_padding_mask=padding)  # (N, K, D)
        sample_out = masked_mean(sample_out, sample_mask, dim=-2)  # (N, D)
        if self.config.rezero:
            plans = sample_out * self.alpha_sample + sample_avg  # c, eq. 2 (N, D)
        else:
            plans = sample_out
        return plans


def _default_mask(action_paths: Tensor, path_mask: Tensor | None, action_probs: Tensor | None = None) -> Tensor:
    """path_mask (N, K, T) bool, all True when None; checked against action_paths (N, K, T[, M])."""
    shape = action_paths.shape if action_probs is None else action_paths.shape[:-1]
    if action_probs is not None and action_probs.shape != action_paths.shape:
        raise ValueError(f"action_probs {tuple(action_probs.shape)} must match action_paths {tuple(action_paths.shape)}")
    if path_mask is None:
        return torch.ones(shape, dtype=torch.bool, device=action_paths.device)
    if path_mask.shape != shape:
        raise ValueError(f"path_mask {tuple(path_mask.shape)} must match action_paths {tuple(shape)} (N, K, T)")
    return path_mask.bool()


def _unique_paths(action_paths: Tensor, path_mask: Tensor, action_probs: Tensor | None,
                  distinct: bool = True) -> tuple[Tensor, Tensor | None, Tensor]:
    """The distinct paths of a batch (masked steps -1): (U, T) long, or in expectation (U, T, M) long and their
    probabilities (U, T, M); and the distinct path of each of the N*K paths, (N*K,). With ``distinct=False``
    every path stands for itself (U = N*K), with no size that depends on the data.

    The probabilities of a distinct path are those of its first occurrence, indexed rather than rebuilt from the
    keys, so that they keep their gradient (a planner trained through them, ``train.joint``). Equal keys come
    from the same computation (a boundary's copies of one path), so that occurrence stands for all of them."""
    if action_probs is None:
        path_keys = torch.where(path_mask, action_paths, -1).flatten(0, 1)  # (N*K, T), -1 = masked step
        if not distinct:
            return path_keys, None, torch.arange(len(path_keys), device=path_keys.device)
        unique_paths, path_of = torch.unique(path_keys, dim=0, return_inverse=True)  # (U, T), (N*K,)
        return unique_paths, None, path_of
    step_mask = path_mask.unsqueeze(-1)  # (N, K, T, 1)
    actions = torch.where(step_mask, action_paths, -1).flatten(0, 1)  # (N*K, T, M)
    probs = torch.where(step_mask, action_probs, 0.0).flatten(0, 1)  # (N*K, T, M)
    if not distinct:
        return actions, probs, torch.arange(len(actions), device=actions.device)
    keys = torch.cat([actions.flatten(1).double(), probs.detach().flatten(1).double()], dim=1)  # (N*K, 2 T M), exact
    unique_keys, path_of = torch.unique(keys, dim=0, return_inverse=True)  # (U, 2 T M), (N*K,)
    rows = torch.arange(len(keys), device=keys.device)
    first = torch.full((len(unique_keys),), len(keys), device=keys.device).scatter_reduce(0, path_of, rows, "amin")
    return actions[first], probs[first], path_of  # (U, T, M) twice, (N*K,)


# --------------------------------------------------------------------------------------------- the registry
ADAPTERS: dict[str, type[Adapter]] = {}


def register_adapter(cls: type[Adapter]) -> type[Adapter]:
    """Add an adapter class under ``cls.name`` (a class decorator too; registering the same class again replaces
    it, another class under a taken name is an error). A class named by its import path needs no registration."""
    name = str(cls.name)
    if not name:
        raise PlanlmError(f"{cls.__name__}: an adapter needs a name (set the class's name)")
    taken = ADAPTERS.get(name)
    if taken is not None and (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
        raise PlanlmError(f"adapter {name!r} is already registered ({taken.__name__}); choose another name")
    ADAPTERS[name] = cls
    return cls


def adapter_class(kind: str) -> type[Adapter]:
    """The class of an adapter kind: a registered name, or an import path (``my_package.module:ClassName``),
    imported now; one-line error naming the kinds, or the path and why it does not import."""
    kind = str(kind)
    cls, registered = named_or_imported(kind, ADAPTERS, "--adapter.kind", "adapter")
    if registered:
        return cls
    wrong = ("" if isinstance(cls, type) and issubclass(cls, Adapter) else
             f"it is {cls!r}, not a subclass of planlm.models.adapter.Adapter")
    if not wrong and not (isinstance(cls.config_class, type) and issubclass(cls.config_class, AdapterConfig)):
        wrong = f"its config_class {cls.config_class!r} is not a subclass of planlm.models.adapter.AdapterConfig"
    if wrong:
        raise PluginImportError(kind, wrong, "--adapter.kind", "adapter", "name an Adapter class (docs/extending.md)")
    return cls


def adapter_kind(cls: type[Adapter], given: str) -> str:
    """The kind a config records for ``cls`` (named ``given``): the built-in name, the import path given, or, for a
    class of your own registered by name, its import path where a fresh process can import it (so a saved model,
    and a distributed relaunch, find it without the code that registered it)."""
    if is_import_path(given) or cls.__module__.split(".")[0] == "planlm":
        return given
    return import_path_of(cls) or given


for _cls in (ProjectAvg, MultiPath):
    register_adapter(_cls)


def build_adapter(config: AdapterConfig, codebook: Tensor | None = None) -> Adapter:
    """The adapter named by ``config.kind``, Emb initialised from ``codebook`` when asked."""
    return adapter_class(config.kind)(config, codebook)


__all__ = ["Adapter", "AdapterSettings", "AdapterConfig", "MultiPathConfig", "ProjectAvg", "MultiPath", "ADAPTERS",
           "register_adapter", "adapter_class", "adapter_kind", "build_adapter", "masked_mean", "gather_rows"]
