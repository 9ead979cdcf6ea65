"""A cacheable dynamics g and prediction f for the planner (``PlannerSettings.dynamics = "causal"``).

The paper's g (``dynamics = "recurrent"``, planlm.models.dynamics) appends Emb(action) to the set of latents and
re-encodes the whole set at every step, so every latent changes and sampling K paths of T steps costs
K * T full passes over the context. Here the set is encoded with a *prefix-causal* mask instead:

    context latents z_0 .. z_n      attend to the context only (bidirectional); they never change
    action latent of step t         Emb(a_{i+t-1}) + position, attends to the context and steps <= t

so the state after t steps is the first n+1+t outputs of one transformer pass over [context; actions],
and appending an action is one new token whose keys and values join a cache (as in a decoder LM):

    teacher forcing   one pass over [z_0..z_n, a_i, .., a_{i+T-2}] for all T steps at once
    sampling          context encoded once per boundary (shared by its K paths), then one token per
                      path and step: the work that grows with K no longer depends on the context length

f is the same prefix-causal stack over g's outputs, then the paper's mean pool (a running mean over
the context and the steps so far) and the linear classifier. Layers mirror nn.TransformerEncoderLayer
(post-norm, ReLU), so g and f have the same parameter counts as the recurrent ones.

The article-level encoder (``PlannerSettings.encoder = "article"``) makes the context causal too: context
latent z_j attends to z_0 .. z_j only. Then a boundary's context states are the prefix of one pass over its
article, and ``article_teacher_forcing`` computes every boundary of an article in one pass:

    [z_0 .. z_n | steps of boundary 0 | steps of boundary 1 | ...]     (n+1) + (n+1)(T-1) tokens
    z_i sees z_0..z_i;  step t of boundary j sees z_0..z_j and the steps <= t of boundary j

with the mean pool as a prefix sum over the context (cumsum). It equals the per-boundary computation
with the causal context mask (tests/models/test_planner.py checks it to 1e-5); the paper's bidirectional
context cannot be shared this way, since every context latent changes with the boundary.

Letters: B boundaries, K paths, n context latents (start latent included), t steps so far, T horizon,
A actions, D width, H heads, Dh head width, N rows (B or B*K), R article rows, J boundaries of a row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import torch
import torch.nn.functional as F
from torch import nn

from planlm.models.dynamics import Dynamics, PlannerFields, step_distribution, top_of

Cache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (rows, H, length, Dh)


class CachedEncoderLayer(nn.Module):
    """nn.TransformerEncoderLayer (post-norm, ReLU) that runs either over a whole masked sequence or one new token
    per row against cached keys and values."""

    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int, dropout: float):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, L, D) -> q, k, v (N, H, L, Dh)."""
        rows, length, width = x.shape
        qkv = self.qkv(x)
        qkv = qkv.view(rows, length, 3, self.num_heads, width // self.num_heads)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.linear2(self.dropout(F.relu(self.linear1(x)))))

    def _finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual + norm around attention and feed-forward. x, attended (N, L, D) -> (N, L, D)."""
        x = self.norm1(x + self.dropout(self.out_proj(attended)))
        return self.norm2(x + self._feed_forward(x))

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, L, D), allowed (N, L, L) bool [query, key] -> output (N, L, D), keys, values (N, H, L, Dh)."""
        q, k, v = self._heads(x)
        drop = self.dropout.p if self.training else 0.0
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed.unsqueeze(1), dropout_p=drop)
        return self._finish(x, attended.transpose(1, 2).flatten(2)), k, v

    def step(self, x: torch.Tensor, context: tuple[torch.Tensor, torch.Tensor], context_mask: torch.Tensor,
             own: tuple[torch.Tensor, torch.Tensor], step: int) -> torch.Tensor:
        """One new token per path against the boundary's context cache and the path's own earlier steps.

        x (B*K, 1, D); context keys/values (B, H, n, Dh) shared by a boundary's K paths; context_mask
        (B, n); own keys/values (B*K, H, >= step+1, Dh): buffers whose first ``step`` slots hold the
        path's earlier steps and whose slot ``step`` receives this one -> output (B*K, 1, D).
        """
        q, k, v = self._heads(x)  # (B*K, H, 1, Dh)
        own[0][:, :, step:step + 1], own[1][:, :, step:step + 1] = k, v
        own_keys, own_values = own[0][:, :, :step + 1], own[1][:, :, :step + 1]  # (B*K, H, t+1, Dh)
        context_keys, context_values = context
        batch, heads, num_context, head_dim = context_keys.shape
        num_paths = x.shape[0] // batch
        q_grouped = q.view(batch, num_paths, heads, head_dim).transpose(1, 2)  # (B, H, K, Dh)
        scale = head_dim ** -0.5
        context_scores = (q_grouped @ context_keys.transpose(-1, -2)) * scale  # (B, H, K, n)
        context_scores = context_scores.masked_fill(~context_mask[:, None, None, :], float("-inf"))
        own_scores = (q @ own_keys.transpose(-1, -2)).squeeze(2) * scale  # (B*K, H, t+1)
        own_scores = own_scores.view(batch, num_paths, heads, -1).transpose(1, 2)  # (B, H, K, t+1)
        weights = torch.softmax(torch.cat([context_scores, own_scores], dim=-1), dim=-1)  # (B, H, K, n+t+1)
        attended = weights[..., :num_context] @ context_values  # (B, H, K, Dh)
        own_weights = weights[..., num_context:].transpose(1, 2).reshape(batch * num_paths, heads, 1, -1)
        attended = attended.transpose(1, 2).reshape(batch * num_paths, heads, 1, head_dim)
        attended = attended + own_weights @ own_values  # (B*K, H, 1, Dh)
        return self._finish(x, attended.transpose(1, 2).flatten(2))


class CausalStack(nn.Module):
    """Layers of CachedEncoderLayer with the prefix-causal mask (the ``transformer`` of g or f)."""

    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int, dropout: float, num_layers: int,
                 causal_context: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(CachedEncoderLayer(d_model, num_heads, dim_feedforward, dropout)
                                    for _ in range(num_layers))
        self.causal_context = causal_context  # the article-level encoder: context latent j sees latents <= j

    def prefix_causal_mask(self, context_mask: torch.Tensor, num_steps: int) -> torch.Tensor:
        """context_mask (N, n) -> allowed (N, n+s, n+s): every query sees the valid context (context queries:
        only up to their own position when ``causal_context``); step latents also see the steps up to their own."""
        rows, num_context = context_mask.shape
        length = num_context + num_steps
        allowed = context_mask[:, None, :].expand(rows, length, num_context)  # (N, L, n)
        if self.causal_context:
            earlier = torch.ones(length, num_context, dtype=torch.bool, device=context_mask.device)
            allowed = allowed & earlier.tril()  # rows >= n (the steps) keep the whole context
        steps = torch.ones(num_steps, num_steps, dtype=torch.bool, device=context_mask.device).tril()
        step_part = torch.zeros(length, num_steps, dtype=torch.bool, device=context_mask.device)
        step_part[num_context:] = steps  # context queries never see the steps
        return torch.cat([allowed, step_part.expand(rows, -1, -1)], dim=2)  # (N, L, L)

    def forward(self, x: torch.Tensor, context_mask: torch.Tensor) -> tuple[torch.Tensor, Cache]:
        """x (N, n+s, D): context then steps; context_mask (N, n) -> output (N, n+s, D), per-layer keys and
        values (N, H, n+s, Dh)."""
        return self.run(x, self.prefix_causal_mask(context_mask, x.shape[1] - context_mask.shape[1]))

    def run(self, x: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, Cache]:
        """x (N, L, D), allowed (N, L, L) [query, key] -> output (N, L, D), per-layer keys and values."""
        cache = []
        for layer in self.layers:
            x, keys, values = layer(x, allowed)
            cache.append((keys, values))
        return x, cache

    def new_buffers(self, rows: int, length: int, like: torch.Tensor) -> Cache:
        """Per layer, empty key and value buffers (rows, H, length, Dh) for the paths' own steps."""
        shape = (rows, self.layers[0].num_heads, length, like.shape[-1])
        return [(like.new_empty(shape), like.new_empty(shape)) for _ in self.layers]

    def step(self, x: torch.Tensor, context: Cache, context_mask: torch.Tensor, own: Cache, step: int) -> torch.Tensor:
        """x (B*K, 1, D) -> (B*K, 1, D); slot ``step`` of every layer's ``own`` buffers receives this step."""
        for layer, layer_context, layer_own in zip(self.layers, context, own):
            x = layer.step(x, layer_context, context_mask, layer_own, step)
        return x


def causal_stack(config: PlannerFields) -> CausalStack:
    """The prefix-causal stack of g or f in the planner's shape."""
    return CausalStack(config.d_model, config.num_heads, config.dim_feedforward, config.dropout, config.num_layers,
                       causal_context=config.encoder == "article")


class CausalPrediction(nn.Module):
    """f: the prefix-causal stack over g's outputs, a running mean over context and steps, linear classifier."""

    def __init__(self, config: PlannerFields):
        super().__init__()
        self.transformer = causal_stack(config)
        self.classifier = nn.Linear(config.d_model, config.num_actions)

    def logits(self, sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The running mean sums / counts (..., D) -> (..., A)."""
        return self.classifier(sums / counts)


@dataclass
class CausalState:
    """The caches after some steps. g_context, f_context: per-layer keys and values of the context
    (B, H, n, Dh), shared by a boundary's paths; context_mask (B, n); sums (N, D) and counts (N, 1) of
    the running mean; slot (N,) of the next action; logits (N, A) of the next action; g_own, f_own:
    per-layer buffers (N, H, horizon-1, Dh) of the rows' own steps, allocated at the first step."""

    g_context: Cache
    f_context: Cache
    context_mask: torch.Tensor
    sums: torch.Tensor
    counts: torch.Tensor
    slot: torch.Tensor
    logits: torch.Tensor
    horizon: int
    steps: int = 0
    g_own: Cache | None = None
    f_own: Cache | None = None

    def repeat_paths(self, num_paths: int) -> CausalState:
        """One row per boundary -> num_paths adjacent rows per boundary (B*K), before the first step."""
        return replace(self, sums=self.sums.repeat_interleave(num_paths, dim=0),
                       counts=self.counts.repeat_interleave(num_paths, dim=0),
                       slot=self.slot.repeat_interleave(num_paths),
                       logits=self.logits.repeat_interleave(num_paths, dim=0))


class CausalDynamics(Dynamics):
    """g: Emb(action) at the next sentence slot, appended to the latents under the prefix-causal mask.

    Decoding (start, step, sample) runs without gradients: its caches are filled in place."""

    prediction_class = CausalPrediction
    mixed_path_counts = False  # the caches hold K adjacent rows per boundary

    def __init__(self, config: PlannerFields, positions: nn.Module):
        super().__init__()
        self.action_embedding = nn.Embedding(config.num_actions, config.d_model)
        self.transformer = causal_stack(config)
        self.positions = positions  # shared with h

    def embed_actions(self, actions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """actions (N, s), slots (N, s) -> step latents (N, s, D)."""
        return self.action_embedding(actions) + self.positions(slots)

    def teacher_forcing(self, prediction: CausalPrediction, latents: torch.Tensor, latent_mask: torch.Tensor,
                        slot: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """All T steps in one pass. latents (B, n, D), latent_mask (B, n), slot (B,), actions (B, T) fed
        actions (step t sees actions < t) -> logits (B, T, A)."""
        horizon = actions.shape[1]
        steps = torch.arange(horizon - 1, device=latents.device)
        step_latents = self.embed_actions(actions[:, :-1], slot[:, None] + steps)  # (B, T-1, D)
        hidden, _ = self.transformer(torch.cat([latents, step_latents], dim=1), latent_mask)  # (B, n+T-1, D)
        hidden, _ = prediction.transformer(hidden, latent_mask)  # (B, n+T-1, D)
        num_context = latents.shape[1]
        weights = latent_mask.unsqueeze(-1).to(hidden.dtype)  # (B, n, 1)
        context_sum = (hidden[:, :num_context] * weights).sum(dim=1, keepdim=True)  # (B, 1, D)
        step_sums = torch.cumsum(hidden[:, num_context:], dim=1)  # (B, T-1, D)
        sums = torch.cat([context_sum, context_sum + step_sums], dim=1)  # (B, T, D)
        counts = weights.sum(dim=1, keepdim=True) + torch.arange(horizon, device=latents.device)[None, :, None]
        return prediction.logits(sums, counts)  # (B, T, A)

    def article_teacher_forcing(self, prediction: CausalPrediction, latents: torch.Tensor, latent_mask: torch.Tensor,
                                actions: torch.Tensor) -> torch.Tensor:
        """Every boundary of an article row in one pass (needs the causal context, encoder "article").

        latents (R, J, D): the start latent then the row's sentences (slots 0 .. J-1), latent_mask (R, J);
        boundary j of a row has context latents 0 .. j and plans from slot j+1; actions (R, J, T) the fed
        actions of each boundary (step t sees actions < t) -> logits (R, J, T, A)."""
        rows, num_bounds, horizon = actions.shape
        num_steps = horizon - 1
        device = latents.device
        slots = torch.arange(num_bounds, device=device)[:, None] + 1 + torch.arange(num_steps, device=device)  # (J, T-1)
        step_latents = self.embed_actions(actions[:, :, :-1].flatten(1), slots.flatten().expand(rows, -1))  # (R, J*(T-1), D)
        allowed = article_mask(latent_mask, num_steps)  # (R, L, L), L = J + J*(T-1)
        hidden, _ = self.transformer.run(torch.cat([latents, step_latents], dim=1), allowed)
        hidden, _ = prediction.transformer.run(hidden, allowed)  # (R, L, D)
        weights = latent_mask.unsqueeze(-1).to(hidden.dtype)  # (R, J, 1)
        context_sums = torch.cumsum(hidden[:, :num_bounds] * weights, dim=1)  # (R, J, D) prefix sums
        step_sums = torch.cumsum(hidden[:, num_bounds:].view(rows, num_bounds, num_steps, -1), dim=2)  # (R, J, T-1, D)
        sums = torch.cat([context_sums.unsqueeze(2), context_sums.unsqueeze(2) + step_sums], dim=2)  # (R, J, T, D)
        counts = torch.cumsum(weights, dim=1).unsqueeze(2) + torch.arange(horizon, device=device)[:, None]  # (R, J, T, 1)
        return prediction.logits(sums, counts)  # (R, J, T, A)

    @torch.no_grad()
    def article_start(self, prediction: CausalPrediction, latents: torch.Tensor, latent_mask: torch.Tensor,
                      row: torch.Tensor, bound: torch.Tensor, horizon: int) -> CausalState:
        """The decoding state of chosen boundaries after one causal pass per article row.

        latents (R, J, D), latent_mask (R, J) as in ``article_teacher_forcing``; row (B,), bound (B,): boundary
        ``bound[b]`` of row ``row[b]`` -> the state ``start`` would give for that boundary's own context."""
        hidden, g_cache = self.transformer(latents, latent_mask)  # (R, J, D), causal over the row
        hidden, f_cache = prediction.transformer(hidden, latent_mask)
        weights = latent_mask.unsqueeze(-1).to(hidden.dtype)  # (R, J, 1)
        sums = torch.cumsum(hidden * weights, dim=1)[row, bound]  # (B, D)
        counts = torch.cumsum(weights, dim=1)[row, bound]  # (B, 1)
        # Keys and values of a row serve its boundaries with the later latents masked out: under the causal
        # context they are exactly the keys and values of the boundary's own context.
        context_mask = latent_mask[row] & (torch.arange(latents.shape[1], device=latents.device) <= bound[:, None])
        g_context = [(keys[row], values[row]) for keys, values in g_cache]  # (B, H, J, Dh)
        f_context = [(keys[row], values[row]) for keys, values in f_cache]
        return CausalState(g_context, f_context, context_mask, sums, counts, bound + 1,
                           prediction.logits(sums, counts), horizon)

    @torch.no_grad()
    def start(self, prediction: CausalPrediction, latents: torch.Tensor, latent_mask: torch.Tensor,
              slot: torch.Tensor, horizon: int) -> CausalState:
        """The context encoded once per boundary: its caches and the step-0 logits (B, A)."""
        hidden, g_context = self.transformer(latents, latent_mask)  # (B, n, D)
        hidden, f_context = prediction.transformer(hidden, latent_mask)  # (B, n, D)
        weights = latent_mask.unsqueeze(-1).to(hidden.dtype)
        sums = (hidden * weights).sum(dim=1)  # (B, D)
        counts = weights.sum(dim=1)  # (B, 1)
        logits = prediction.logits(sums, counts)  # (B, A)
        return CausalState(g_context, f_context, latent_mask, sums, counts, slot, logits, horizon)

    @torch.no_grad()
    def step(self, prediction: CausalPrediction, state: CausalState, actions: torch.Tensor) -> CausalState:
        """One cached token per row (N = B*K, a boundary's K paths adjacent): actions (N,)."""
        g_own, f_own = state.g_own, state.f_own
        if g_own is None:  # filled one step at a time
            g_own = self.transformer.new_buffers(len(actions), state.horizon - 1, state.g_context[0][0])
            f_own = prediction.transformer.new_buffers(len(actions), state.horizon - 1, state.f_context[0][0])
        new = self.embed_actions(actions[:, None], state.slot[:, None])  # (N, 1, D)
        new = self.transformer.step(new, state.g_context, state.context_mask, g_own, state.steps)
        new = prediction.transformer.step(new, state.f_context, state.context_mask, f_own, state.steps)
        sums, counts = state.sums + new[:, 0], state.counts + 1
        logits = prediction.logits(sums, counts)  # (N, A)
        return replace(state, sums=sums, counts=counts, slot=state.slot + 1, logits=logits, steps=state.steps + 1,
                       g_own=g_own, f_own=f_own)

    @torch.no_grad()
    def sample_from(self, prediction: CausalPrediction, state: CausalState, num_paths: int, temperature: float,
                    generator: torch.Generator | None, top_actions: int = 0):
        """``sample`` from a start state (``start`` or ``article_start``; one row per boundary): K draws per boundary
        at step 0 (a boundary's paths share that state), then one per path and step."""
        horizon, batch = state.horizon, state.logits.shape[0]

        def draw(logits: torch.Tensor, draws: int, repeat: int = 1) -> torch.Tensor:  # (N, A) -> (N, draws)
            probs = step_distribution(logits, temperature)
            if top_actions:  # the step's top M, one row per path
                for out, x in zip(steps, top_of(probs, top_actions)):
                    out.append(x.repeat_interleave(repeat, dim=0))
            return torch.multinomial(probs, draws, replacement=True, generator=generator)

        steps: tuple[list, list] = ([], [])
        actions = [draw(state.logits, num_paths, num_paths).reshape(-1)]  # (B*K,)
        state = state.repeat_paths(num_paths)
        for _ in range(1, horizon):
            state = self.step(prediction, state, actions[-1])
            actions.append(draw(state.logits, 1)[:, 0])
        paths = torch.stack(actions, dim=1).view(batch, num_paths, horizon)  # (B, K, T)
        if not top_actions:
            return paths
        return (paths, *(torch.stack(x, dim=1).view(*paths.shape, -1) for x in steps))  # + (B, K, T, M) twice


def article_mask(latent_mask: torch.Tensor, num_steps: int) -> torch.Tensor:
    """latent_mask (R, J) -> allowed (R, L, L) over [latents; the T-1 steps of boundary 0; of boundary 1; ...]:
    latent i sees the valid latents <= i; step t of boundary j sees the valid latents <= j and the steps <= t
    of boundary j. L = J + J*(T-1)."""
    num_bounds, device = latent_mask.shape[1], latent_mask.device
    bound = torch.arange(num_bounds, device=device)
    query_bound = torch.cat([bound, bound.repeat_interleave(num_steps)])  # (L,) the boundary whose prefix a query sees
    query_step = torch.cat([torch.full_like(bound, -1), torch.arange(num_steps, device=device).repeat(num_bounds)])
    sees_latent = bound[None, :] <= query_bound[:, None]  # (L, J)
    sees_step = ((query_bound[:, None] == query_bound[None, num_bounds:])
                 & (query_step[num_bounds:][None, :] <= query_step[:, None]))  # (L, J*(T-1)); latents: step -1
    allowed = torch.cat([sees_latent, sees_step], dim=1)  # (L, L)
    key_valid = torch.cat([latent_mask, latent_mask.new_ones(latent_mask.shape[0], num_bounds * num_steps)], dim=1)
    return allowed[None] & key_valid[:, None, :]  # (R, L, L)
