"""The adapters: Project-and-Avg matches its formula; a fresh multipath adapter is exactly Project-and-Avg."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from planlm.errors import PlanlmError
from planlm.models.adapter import AdapterConfig, MultiPath, ProjectAvg, build_adapter

NUM_ACTIONS, ACTION_DIM, WIDTH, HORIZON = 8, 6, 16, 4


def config(**overrides) -> AdapterConfig:
    base = dict(num_actions=NUM_ACTIONS, action_dim=ACTION_DIM, hidden_size=WIDTH, horizon=HORIZON, num_heads=2)
    return AdapterConfig(**{**base, **overrides})


def live(adapter):
    """``adapter`` with W and b at PyTorch's init instead of the no-op zero every adapter starts at: its plan
    vectors move."""
    adapter.projection.reset_parameters()
    return adapter


def paths_and_mask(seed: int = 0, num_sentences: int = 5, num_paths: int = 3, horizon: int = HORIZON):
    gen = torch.Generator().manual_seed(seed)
    action_paths = torch.randint(0, NUM_ACTIONS, (num_sentences, num_paths, horizon), generator=gen)  # (N, K, T)
    path_mask = torch.rand(num_sentences, num_paths, horizon, generator=gen) > 0.4  # (N, K, T)
    path_mask[..., 0] = True
    path_mask[0, 1] = False  # one path with no valid step: must not count in the average over paths
    return action_paths, path_mask


def set_alphas(adapter: MultiPath, alpha_path: float, alpha_sample: float) -> MultiPath:
    """Switch the ReZero scalars on (alpha_1, alpha_2): a fresh multipath adapter is Project and Avg."""
    with torch.no_grad():
        adapter.alpha_path.fill_(alpha_path)
        adapter.alpha_sample.fill_(alpha_sample)
    return adapter


def test_project_avg_matches_the_paper_formula():
    adapter = live(ProjectAvg(config()))
    action_paths, path_mask = paths_and_mask()
    got = adapter(action_paths, path_mask)  # (N, D)
    W, b = adapter.projection.weight, adapter.projection.bias
    for n in range(action_paths.shape[0]):
        path_vectors = []
        for j in range(action_paths.shape[1]):
            steps = [W @ adapter.action_embedding.weight[a] + b
                     for a, valid in zip(action_paths[n, j], path_mask[n, j]) if valid]
            if steps:
                path_vectors.append(torch.stack(steps).mean(0))  # c~^j
        torch.testing.assert_close(got[n], torch.stack(path_vectors).mean(0), atol=1e-5, rtol=1e-5)


def test_fresh_multipath_equals_project_avg_exactly():
    torch.manual_seed(0)
    multipath = live(MultiPath(config(kind="multipath")))
    project_avg = ProjectAvg(config())
    result = project_avg.load_state_dict(multipath.state_dict(), strict=False)
    assert not result.missing_keys  # the shared Emb, W, b
    for seed in range(3):
        action_paths, path_mask = paths_and_mask(seed)
        torch.testing.assert_close(multipath(action_paths, path_mask), project_avg(action_paths, path_mask),
                                   atol=1e-6, rtol=1e-6)
    # ... but not a frozen copy: alpha_2 gets a gradient at once; alpha_1 once alpha_2 is not zero (eq. 2
    # adds c^ = mean of c~^j, not of c^j, so at alpha_2 = 0 the path vectors c^j do not reach the output).
    multipath(*paths_and_mask()).pow(2).sum().backward()
    assert multipath.alpha_sample.grad.abs() > 0 and multipath.alpha_path.grad == 0
    with torch.no_grad():
        multipath.alpha_sample.fill_(0.1)
    multipath.zero_grad()
    multipath(*paths_and_mask()).pow(2).sum().backward()
    assert multipath.alpha_path.grad.abs() > 0
    set_alphas(multipath, 1.0, 1.0)
    assert not torch.allclose(multipath(*paths_and_mask()), project_avg(*paths_and_mask()), atol=1e-4)


def test_multipath_reads_order_within_a_path_but_not_order_of_paths():
    torch.manual_seed(0)
    adapter = set_alphas(live(MultiPath(config(kind="multipath"))).eval(), 1.0, 1.0)
    action_paths = torch.tensor([[[0, 1, 2, 3], [4, 5, 6, 7]]])  # (1, 2, 4)
    mask = torch.ones_like(action_paths, dtype=torch.bool)
    reference = adapter(action_paths, mask)
    # Paths are an unordered sample: swapping them changes nothing.
    torch.testing.assert_close(adapter(action_paths.flip(1), mask), reference, atol=1e-5, rtol=1e-5)
    # Steps are a sequence: reversing a path changes the plan vector (Project-and-Avg could not tell).
    assert not torch.allclose(adapter(action_paths.flip(2), mask), reference, atol=1e-4)
    plain = ProjectAvg(config())
    plain.load_state_dict(adapter.state_dict(), strict=False)
    torch.testing.assert_close(plain(action_paths.flip(2), mask), plain(action_paths, mask))


def test_no_rezero_ablation_drops_the_scalars_and_the_skip():
    torch.manual_seed(0)
    ablation = live(MultiPath(config(kind="multipath", rezero=False)))
    assert not hasattr(ablation, "alpha_path")
    project_avg = ProjectAvg(config())
    project_avg.load_state_dict(ablation.state_dict(), strict=False)
    action_paths, path_mask = paths_and_mask()
    out = ablation(action_paths, path_mask)
    assert out.shape == (5, WIDTH) and torch.isfinite(out).all()
    assert not torch.allclose(out, project_avg(action_paths, path_mask), atol=1e-3)


def multipath_by_hand(adapter: MultiPath, action_paths, path_mask):
    """Equations 1-2 (or the no-ReZero ablation) rebuilt sentence by sentence from the adapter's own weights:
    only the valid steps of a path enter the PathTransformer, at their own positions, and only the valid
    paths enter the SampleTransformer (no padding masks), then plain means."""
    W, b, U = adapter.projection.weight, adapter.projection.bias, adapter.path_input
    emb, positions = adapter.action_embedding.weight, adapter.step_position.weight
    rezero = adapter.config.rezero
    plans = []
    for n in range(action_paths.shape[0]):
        path_vectors, path_avgs = [], []
        for j in range(action_paths.shape[1]):
            steps = [t for t in range(action_paths.shape[2]) if path_mask[n, j, t]]
            if not steps:
                continue  # a path with no valid step is no part of the sample
            e = emb[action_paths[n, j, steps]]  # Emb(a_t^j) (T_valid, E)
            c_avg = (e @ W.T + b).mean(0)  # c~^j: the mean of c_t^j = W Emb(a_t^j) + b
            u = e if isinstance(adapter.path_input, nn.Identity) else e @ U.weight.T + U.bias  # U Emb(a_t^j)
            pt = adapter.path_transformer((u + positions[steps])[None])[0].mean(0)  # PT(U Emb(a) + p), pooled
            path_vectors.append(pt * adapter.alpha_path + c_avg if rezero else pt)  # c^j, eq. 1
            path_avgs.append(c_avg)
        st = adapter.sample_transformer(torch.stack(path_vectors)[None])[0].mean(0)  # ST(c^1..c^K), pooled
        plans.append(st * adapter.alpha_sample + torch.stack(path_avgs).mean(0) if rezero else st)  # c, eq. 2
    return torch.stack(plans)  # (N, D)


@pytest.mark.parametrize("action_dim", [ACTION_DIM, WIDTH])  # U a learned map E -> D, or the identity (E = D)
@pytest.mark.parametrize("rezero", [True, False])
def test_multipath_matches_equations_1_and_2_rebuilt_from_its_transformers(rezero, action_dim):
    torch.manual_seed(0)
    adapter = live(MultiPath(config(kind="multipath", rezero=rezero, num_layers=2, action_dim=action_dim))).eval()
    with torch.no_grad():
        adapter.step_position.weight.normal_(std=0.5)  # positions that matter
        if rezero:
            adapter.alpha_path.fill_(0.7)  # alpha_1
            adapter.alpha_sample.fill_(-1.3)  # alpha_2
    action_paths, path_mask = paths_and_mask(seed=2, num_sentences=4, num_paths=3)
    path_mask[1, 2, 1:3] = False  # a path with a hole: step 4 keeps its own position p_4
    path_mask[1, 2, 3] = True
    path_mask[2, :, 1:] = False  # paths of one step
    assert not path_mask[0, 1].any() and (~path_mask).any(-1).sum() >= 3  # a masked path, masked steps
    with torch.no_grad():
        got = adapter(action_paths, path_mask)
        expected = multipath_by_hand(adapter, action_paths, path_mask)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # The reference can tell the two forms apart (the skips of eqs. 1-2 move c by far more than the tolerance).
    if rezero:
        adapter.config.rezero = False
        with torch.no_grad():
            ablated = multipath_by_hand(adapter, action_paths, path_mask)
        assert (ablated - expected).abs().max() > 1e-2


@pytest.mark.parametrize("kind", ["project_avg", "multipath"])
def test_no_op_init_and_codebook_init(kind):
    codebook = torch.randn(NUM_ACTIONS, ACTION_DIM)
    adapter = build_adapter(config(kind=kind), codebook)
    torch.testing.assert_close(adapter.action_embedding.weight.detach(), codebook)
    action_paths, path_mask = paths_and_mask()
    out = adapter(action_paths, path_mask)
    assert torch.count_nonzero(out) == 0  # a fresh adapter leaves the LM unchanged ...
    out.sum().backward()
    assert adapter.projection.weight.grad.abs().sum() > 0  # ... and still learns
    with pytest.raises(PlanlmError, match="cannot initialise an action embedding"):
        build_adapter(config(kind=kind), torch.randn(NUM_ACTIONS, ACTION_DIM + 1))


def test_all_paths_masked_gives_finite_output():
    adapter = MultiPath(config(kind="multipath", rezero=False))
    action_paths = torch.zeros(2, 3, HORIZON, dtype=torch.long)
    mask = torch.zeros_like(action_paths, dtype=torch.bool)
    assert torch.isfinite(adapter(action_paths, mask)).all()


def test_config_errors_name_the_flag():
    with pytest.raises(PlanlmError, match="--adapter.num_heads 3 must divide"):
        config(kind="multipath", num_heads=3)
    with pytest.raises(PlanlmError, match="adapter horizon must be >= 1"):
        config(horizon=0)
    with pytest.raises(PlanlmError, match="--adapter.kind 'mean'"):
        config(kind="mean")
    with pytest.raises(PlanlmError, match="horizon"):
        MultiPath(config(kind="multipath"))(torch.zeros(1, 1, HORIZON + 1, dtype=torch.long))


def test_multipath_encodes_each_distinct_path_once_without_changing_results():
    torch.manual_seed(0)
    adapter = set_alphas(live(MultiPath(config(kind="multipath"))).eval(), 0.5, 0.5)
    action_paths, path_mask = paths_and_mask(num_sentences=4)
    action_paths[1] = action_paths[0]  # repeated paths across sentences ...
    path_mask[1] = path_mask[0]
    action_paths[2, 1] = torch.where(path_mask[2, 0], action_paths[2, 0], 7)  # ... and a path differing only
    path_mask[2, 1] = path_mask[2, 0]                                          # at masked steps
    batched = adapter(action_paths, path_mask)
    one_by_one = torch.cat([adapter(action_paths[n:n + 1], path_mask[n:n + 1]) for n in range(4)])
    torch.testing.assert_close(batched, one_by_one, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batched[0], batched[1])


@pytest.mark.parametrize("in_expectation", [False, True])
def test_multipath_compiles_in_one_graph_with_the_eager_result(in_expectation):
    """Under torch.compile the adapter encodes every path with its padding mask: no graph break (torch.unique and
    the host-side padding check would each break it), and the plan vectors are the eager ones."""
    import torch._dynamo

    torch.manual_seed(0)
    adapter = set_alphas(live(MultiPath(config(kind="multipath"))), 0.5, 0.7)
    action_paths, path_mask = paths_and_mask(num_sentences=4)
    action_paths[1] = action_paths[0]  # repeated paths, which eager mode encodes once
    path_mask[1] = path_mask[0]
    args = (action_paths, path_mask)
    if in_expectation:
        gen = torch.Generator().manual_seed(1)
        args = (torch.randint(0, NUM_ACTIONS, (*action_paths.shape, 3), generator=gen), path_mask,
                torch.softmax(torch.randn(*action_paths.shape, 3, generator=gen), -1))
    explained = torch._dynamo.explain(adapter.forward)(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(adapter.forward, backend="eager", fullgraph=True)(*args)
    torch.testing.assert_close(compiled, adapter(*args), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("action_dim", [ACTION_DIM, WIDTH])  # a map E -> D, or the paper's identity (E = D)
def test_path_transformer_reads_the_actions_from_the_first_step(action_dim):
    torch.manual_seed(0)
    adapter = MultiPath(config(kind="multipath", action_dim=action_dim), torch.randn(NUM_ACTIONS, action_dim)).eval()
    assert isinstance(adapter.path_input, torch.nn.Identity) == (action_dim == WIDTH)
    action_paths = torch.tensor([[[0, 1, 2, 3]], [[4, 5, 6, 7]], [[3, 2, 1, 0]]])  # (3, 1, 4)
    mask = torch.ones_like(action_paths, dtype=torch.bool)
    assert torch.count_nonzero(adapter(action_paths, mask)) == 0  # exact no-op (alpha = 0, W = b = 0) ...
    tokens = adapter.path_input(adapter.action_embedding(action_paths[:, 0])) + adapter.step_position.weight
    pooled = adapter.path_transformer(tokens).mean(1)  # (3, D): what alpha_1 scales
    # ... yet PT sees which actions a path holds, and in which order: not just the positions p_1..p_T.
    assert torch.cdist(pooled, pooled)[~torch.eye(3, dtype=torch.bool)].min() > 0.1


def test_training_switches_both_rezero_scalars_on():
    torch.manual_seed(0)
    adapter = MultiPath(config(kind="multipath"), torch.randn(NUM_ACTIONS, ACTION_DIM))
    target = torch.randn(5, WIDTH)
    optimizer = torch.optim.Adam(adapter.parameters(), lr=1e-2)
    assert adapter.alphas() == {"alpha_1": 0.0, "alpha_2": 0.0}
    for _ in range(3):  # alpha_2 moves at step 1, alpha_1 once alpha_2 is not zero
        optimizer.zero_grad()
        (adapter(*paths_and_mask()) - target).pow(2).sum().backward()
        optimizer.step()
    assert all(abs(value) > 0 for value in adapter.alphas().values())
    assert ProjectAvg(config()).alphas() is None
    assert MultiPath(config(kind="multipath", rezero=False)).alphas() is None


def test_multipath_backward_is_reproducible(two_threads):
    """Distinct paths are encoded once and gathered back to every (sentence, path) that holds them; the
    gradients of the repeats must sum in the same order every time (see ``gather_rows``)."""
    torch.manual_seed(0)
    adapter = live(build_adapter(config(kind="multipath", hidden_size=128)))  # N*K*D above the parallel grain
    action_paths, path_mask = paths_and_mask(num_sentences=128, num_paths=4, horizon=2)  # few distinct paths

    def grads() -> list[torch.Tensor]:
        adapter.zero_grad()
        adapter(action_paths, path_mask).square().sum().backward()
        return [p.grad.clone() for p in adapter.parameters() if p.grad is not None]

    first = grads()
    for _ in range(30):
        assert all(torch.equal(a, b) for a, b in zip(first, grads()))



# ------------------------------------------------------------------------------------- one config per adapter kind
MULTIPATH_KEYS = ["alpha_path", "alpha_sample", "action_embedding.weight", "projection.weight", "projection.bias",
                  "path_input.weight", "path_input.bias", "step_position.weight"] + [
    f"{stack}.layers.0.{name}" for stack in ("path_transformer", "sample_transformer") for name in (
        "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
        "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias", "norm1.weight", "norm1.bias",
        "norm2.weight", "norm2.bias")]
OLD_SHAPE = {"num_layers": 1, "num_heads": 2, "dim_feedforward": None, "rezero": True}
"""The multipath fields that the one settings class of earlier releases gave every kind's saved config."""


def test_a_saved_config_holds_only_the_fields_of_its_kind():
    from planlm.jsonio import to_jsonable
    from planlm.models.adapter import MultiPathConfig

    sizes = {"action_dim": ACTION_DIM, "num_actions": NUM_ACTIONS, "hidden_size": WIDTH, "horizon": HORIZON}
    project_avg = AdapterConfig(kind="project_avg", **sizes)
    multipath = AdapterConfig(kind="multipath", **sizes, num_layers=2)
    assert type(project_avg) is AdapterConfig and type(multipath) is MultiPathConfig
    assert to_jsonable(project_avg) == {"kind": "project_avg", **sizes}
    assert to_jsonable(multipath) == {"kind": "multipath", **sizes, **OLD_SHAPE, "num_layers": 2}


@pytest.mark.parametrize("kind", ["project_avg", "multipath"])
def test_a_model_folder_of_the_one_settings_class_loads_to_the_same_adapter(kind, tmp_path, tiny_lm):
    """planned_lm.json as earlier releases wrote it (the multipath fields for every kind) reads as the kind's own
    config, and the model computes what it computed."""
    import json

    from planlm.models.planned_lm import PlannedLM, PlannedLMConfig

    torch.manual_seed(0)
    adapter = config(kind=kind, hidden_size=32)
    model = PlannedLM(PlannedLMConfig(plans={"kind": "oracle", "num_paths": 3, "horizon": HORIZON}, adapter=adapter),
                      tiny_lm).eval()
    live(model.adapter)
    folder = model.save_pretrained(tmp_path / "lm")
    path = folder / "planned_lm.json"
    values = json.loads(path.read_text())
    values["adapter"] = {**OLD_SHAPE, **values["adapter"]}
    path.write_text(json.dumps(values))
    loaded = PlannedLM.from_pretrained(folder).eval()
    assert loaded.config.adapter == adapter and type(loaded.config.adapter) is type(adapter)
    action_paths, path_mask = paths_and_mask()
    torch.testing.assert_close(loaded.plan_vectors(action_paths, path_mask), model.plan_vectors(action_paths, path_mask),
                               atol=0, rtol=0)


def test_the_built_in_adapters_keep_their_parameters_their_init_and_their_reuse_key():
    """What the demo's bit-identical rerun rests on: the parameter names and order, the draws of a fresh adapter
    from the global generator, and the settings' reuse key of earlier releases."""
    from planlm.models.adapter import AdapterSettings

    def built(settings: AdapterSettings):
        torch.manual_seed(0)
        adapter = build_adapter(AdapterConfig.of(settings, num_actions=NUM_ACTIONS, codebook_width=ACTION_DIM,
                                                 hidden_size=WIDTH, horizon=HORIZON))
        return adapter, torch.rand(())  # the generator's next draw: what the adapter's init consumed

    multipath, after = built(AdapterSettings(kind="multipath"))
    assert list(multipath.state_dict()) == MULTIPATH_KEYS  # U is a map E -> D here (E = 6, D = 16)
    torch.manual_seed(0)
    direct = MultiPath(config(kind="multipath", num_layers=1, num_heads=2, rezero=True))
    assert torch.equal(torch.rand(()), after)
    for key, value in direct.state_dict().items():
        assert torch.equal(value, multipath.state_dict()[key]), key
    assert list(built(AdapterSettings(kind="project_avg"))[0].state_dict()) == [
        "action_embedding.weight", "projection.weight", "projection.bias"]
    assert AdapterSettings().reuse_key() == {"kind": "project_avg", **OLD_SHAPE}
    assert AdapterSettings(kind="multipath", rezero=False, num_heads=4).reuse_key() == \
        {"kind": "multipath", **OLD_SHAPE, "rezero": False, "num_heads": 4}


def test_an_adapter_of_ones_own_brings_its_own_config(monkeypatch):
    from dataclasses import dataclass

    from planlm.jsonio import to_jsonable
    from planlm.models.adapter import ADAPTERS, AdapterSettings, register_adapter

    @dataclass
    class ScaledConfig(AdapterConfig):
        scale: float = 1.0
        num_layers: int = 4  # a name multipath also has, with a default of its own

    class Scaled(ProjectAvg):
        name = "scaled"
        config_class = ScaledConfig

        def forward(self, action_paths, path_mask=None, action_probs=None):
            return self.config.scale * super().forward(action_paths, path_mask, action_probs)

    monkeypatch.setitem(ADAPTERS, "scaled", Scaled)
    register_adapter(Scaled)
    sizes = dict(num_actions=NUM_ACTIONS, codebook_width=ACTION_DIM, hidden_size=WIDTH, horizon=HORIZON)
    settings = AdapterSettings(kind="scaled", options={"scale": "0.5"})  # as --adapter.options.scale 0.5 gives it
    made = AdapterConfig.of(settings, **sizes)
    assert type(made) is ScaledConfig and made.scale == 0.5 and made.num_layers == 4
    assert set(to_jsonable(made)) == {"kind", "action_dim", "num_actions", "hidden_size", "horizon", "scale",
                                      "num_layers"}
    assert AdapterConfig.of(AdapterSettings(kind="scaled", num_layers=2), **sizes).num_layers == 2
    assert AdapterConfig.of(AdapterSettings(kind="project_avg", num_layers=2, rezero=False), **sizes) == \
        AdapterConfig(kind="project_avg", action_dim=ACTION_DIM, num_actions=NUM_ACTIONS, hidden_size=WIDTH,
                      horizon=HORIZON)  # settings shared by conditions of several kinds: project_avg has no layers
    with pytest.raises(PlanlmError, match=r"^--adapter.options \['gate'\]: adapter scaled \(ScaledConfig\) has no "
                                          r"such setting; it takes \['num_layers', 'scale'\]$"):
        AdapterSettings(kind="scaled", options={"gate": 1})
    with pytest.raises(PlanlmError, match=r"--adapter.options \['num_layers'\]: set each of them once"):
        AdapterSettings(kind="scaled", num_layers=2, options={"num_layers": 3}).fields()
    with pytest.raises(PlanlmError, match=r"^adapter scaled: ScaledConfig has no field\(s\) \['gate'\]"):
        AdapterConfig(kind="scaled", gate=1)
    from planlm.models.adapter import MultiPathConfig

    with pytest.raises(PlanlmError, match=r"^adapter scaled reads a ScaledConfig, not a MultiPathConfig"):
        MultiPathConfig(kind="scaled")
