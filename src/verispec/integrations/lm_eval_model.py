"""The ``verispec`` model of lm-evaluation-harness (:class:`VerispecLM`): generation through verispec's engine
with any rule, the rule's true baseline or target-only sampling; log-likelihoods from the target. The
command that registers it and runs lm_eval is :mod:`verispec.integrations.lm_eval` (``verispec lm-eval``).

Its arguments (``--model_args`` override ``verispec lm-eval``'s flags): ``rule``, ``gamma`` (an integer or
``auto``), ``tree``, ``draft_source`` (``model``, ``ngram``, ``none``), ``baseline``, ``seed``, ``rows`` (rows
decoded together), ``max_gen_toks``, ``add_bos_token``, and the model flags ``target``, ``draft``, ``n_ctx``,
``n_threads``, ``device``, ``dtype``, ``batch_invariant``. A task's generation arguments may carry
``verification`` (``{rule, gamma, tree, draft}``) and ``baseline`` as ``verispec serve``'s requests do
(``--gen_kwargs '{"verification": {"rule": "lenience:ell=0.5"}}'``).

``generate_until`` decodes all of a call's requests together on a
:class:`~verispec.engine.session.BatchSession` (chains of the draft model with a fixed γ, target-only and
true-baseline rows; continuous batching), or one at a time with :func:`verispec.engine.generate` (prompt
lookup, trees, ``gamma=auto``, raw-distribution rules). ``until`` are a request's stop strings,
``max_gen_toks`` its budget, ``do_sample: false`` or ``temperature: 0`` greedy, ``top_p`` / ``top_k`` /
``min_p`` its truncation. ``loglikelihood`` scores context + continuation with one target forward (the raw
model distribution, temperature 1; :meth:`BatchSession.score`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from verispec.engine.request import DRAFT_SOURCES, Decode, generate_single, resolve_verification, row_request
from verispec.engine.session import BatchSession
from verispec.integrations.lm_eval_args import boolean_arg, check_rule_applies, model_args
from verispec.models.base import tokenizer_size
from verispec.params import check_number, shown
from verispec.sampling import SamplingConfig
from verispec.settings import MAX_N_CTX, check_model_settings

MODEL_NAME = "verispec"
#: Defaults of the model's arguments; ``verispec lm-eval`` writes its flags here before running lm_eval.
DEFAULTS: dict[str, Any] = {}


class VerispecLM(TemplateLM):
    """The ``verispec`` model of lm-evaluation-harness (module docstring). ``backends``: pre-built
    ``(target_rows, draft_rows or None, single_target, single_draft or None)`` instead of loading from
    ``target`` / ``draft`` (tests; embedding)."""

    def __init__(self, rule: str = "lossless", gamma: int | str = 5, tree: str | None = None,
                 draft_source: str | None = None, baseline: bool = False, seed: int = 1234, rows: int = 8,
                 max_gen_toks: int = 256, add_bos_token: bool = False, target: str | None = None,
                 draft: str | None = None, n_ctx: int = 4096, n_threads: int | None = None, device: str = "cpu",
                 dtype: str | None = None, batch_invariant: bool = False, backends: tuple | None = None,
                 batch_size: Any = None, max_batch_size: Any = None, **unused: Any) -> None:
        super().__init__()
        if unused:
            raise ValueError(f"unknown model_args for the verispec model: {shown(', '.join(sorted(unused)))} (known: "
                             "rule, gamma, tree, draft_source, baseline, seed, rows, max_gen_toks, add_bos_token, "
                             "target, draft, n_ctx, n_threads, device, dtype, batch_invariant)")
        a = model_args(dict(rule=rule, gamma=gamma, tree=tree, draft_source=draft_source, baseline=baseline, seed=seed,
                            rows=rows, max_gen_toks=max_gen_toks, add_bos_token=add_bos_token, target=target,
                            draft=draft, n_ctx=n_ctx, n_threads=n_threads, device=device, dtype=dtype,
                            batch_invariant=batch_invariant))
        rule, gamma, tree, draft_source, baseline = a["rule"], a["gamma"], a["tree"], a["draft_source"], a["baseline"]
        seed, rows, max_gen_toks, add_bos_token = a["seed"], a["rows"], a["max_gen_toks"], a["add_bos_token"]
        target, draft, batch_invariant = a["target"], a["draft"], a["batch_invariant"]
        check_rule_applies(rule, draft_source or "model", baseline, flag=False)
        settings = SimpleNamespace(target=target, draft=draft, n_ctx=a["n_ctx"], n_threads=a["n_threads"],
                                   device=a["device"], dtype=a["dtype"], lookup=False)
        ngram = False
        if backends is None:
            from verispec.models import is_ngram_draft, load_pair

            check_model_settings(settings, need_draft=draft_source != "none" and not baseline)

            ngram = is_ngram_draft(draft)
            rows_t, rows_d, _ = load_pair(settings, batch_size=int(rows), batch_invariant=bool(batch_invariant),
                                          need_draft=draft_source != "none" and not baseline)
            self._single, self._settings = None, settings
        else:
            rows_t, rows_d, single_t, single_d = backends
            self._single, self._settings = (single_t, single_d), None
        self.target_rows, self.draft_rows = rows_t, rows_d
        self.rows = rows_t.batch_size
        self.width = min(rows_t.vocab_size, tokenizer_size(rows_t))
        self.rule, self.gamma, self.tree = rule, ("auto" if gamma == "auto" else int(gamma)), tree
        self.draft = draft_source or ("ngram" if ngram else "model" if rows_d is not None else "none")
        self.baseline, self.seed = bool(baseline), int(seed)
        self.max_gen_toks, self.add_bos_token = int(max_gen_toks), bool(add_bos_token)
        self.decoding({})       # the settings must make a valid decoding: fail now, not after loading the data

    # -- settings ------------------------------------------------------------------------------------
    def decoding(self, gen_kwargs: dict, max_tokens: int | None = None, stop: list[str] | None = None) -> Decode:
        """The decoding of one request's generation arguments over the model's settings."""
        baseline = boolean_arg("gen_kwargs baseline", gen_kwargs.get("baseline", self.baseline))
        temperature = gen_kwargs.get("temperature")
        temperature = 0.0 if temperature is None else check_number(temperature, "gen_kwargs temperature", lo=0.0)
        greedy = not boolean_arg("gen_kwargs do_sample", gen_kwargs.get("do_sample", False)) or temperature == 0.0
        values = {"temperature": 0.0 if greedy else temperature}
        for key in ("top_p", "top_k", "min_p"):
            if gen_kwargs.get(key) is not None:
                values[key] = gen_kwargs[key]
        sources = tuple(x for x in DRAFT_SOURCES if x != "model" or self.draft_rows is not None)
        return resolve_verification(gen_kwargs.get("verification"), rule=self.rule, gamma=self.gamma, tree=self.tree,
                                    draft=self.draft, baseline=baseline,
                                    sampling=SamplingConfig(**values), max_tokens=max_tokens or self.max_gen_toks,
                                    stop=stop or [], seed=self.seed, draft_sources=sources)

    # -- TemplateLM ----------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        eos = self.target_rows.eos_token_ids
        return min(eos) if eos else 0

    @property
    def max_length(self) -> int:
        return int(self.target_rows.context_length)

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.target_rows, "name", MODEL_NAME)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        ids = getattr(string, "ids", None)          # a prompt rendered by apply_chat_template
        if ids is not None:
            return list(ids)
        return list(self.target_rows.tokenize(string, add_special=bool(add_special_tokens) or self.add_bos_token))

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """A system + user conversation rendered with the target's chat template (its text, carrying its token
        ids, special tokens included)."""
        roles = [m["role"] for m in chat_history]
        if roles not in (["user"], ["system", "user"]):
            raise ValueError("the verispec model renders one user turn (after an optional system turn): run "
                             "lm_eval without --fewshot_as_multiturn")
        ids = self.target_rows.chat_prompt(chat_history[-1]["content"],
                                           system=chat_history[0]["content"] if len(roles) == 2 else None)
        return _ChatPrompt(self.target_rows.detokenize(ids), ids)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        tok = getattr(getattr(self.target_rows, "single", None), "tokenizer", None)
        return getattr(tok, "chat_template", None) or ""

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        from tqdm import tqdm

        session = BatchSession(self.target_rows, None, target_width=self.width)
        out = []
        for key, context, continuation in tqdm(requests, disable=disable_tqdm, desc="verispec loglikelihood"):
            tokens = (list(context) + list(continuation))[-(self.max_length - 1):]
            start = max(len(tokens) - len(continuation), 1)
            scores = session.score(tokens, 1)
            logprob = sum(scores.token_logprobs[start:])
            greedy = all(scores.top[i][0][0] == tokens[i] for i in range(start, len(tokens)))
            out.append((float(logprob), bool(greedy)))
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, out[-1])
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval import utils

        out = []
        for (string,) in [req.args for req in requests]:
            windows = [(None,) + utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length - 1, context_len=1)]
            total = sum(x[0] for x in self._loglikelihood_tokens(windows, disable_tqdm=True))
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from tqdm import tqdm

        jobs = []
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args[0], dict(req.args[1])
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            budget = gen_kwargs.get("max_gen_toks", self.max_gen_toks)
            budget = int(check_number(int(budget) if isinstance(budget, float) and budget.is_integer() else budget,
                                      "gen_kwargs max_gen_toks", kind=int, lo=1, hi=MAX_N_CTX))
            d = self.decoding(gen_kwargs, budget, until)
            keep = self.max_length - d.max_tokens - d.verify_room
            if keep < 1:
                raise ValueError(f"max_gen_toks {d.max_tokens} leaves no room for a prompt in a context of "
                                 f"{self.max_length} tokens: raise n_ctx or lower max_gen_toks")
            jobs.append((i, self.tok_encode(context)[-keep:], d))
        results: list[str | None] = [None] * len(jobs)
        bar = tqdm(total=len(jobs), disable=disable_tqdm, desc=f"verispec generate ({self.rows} rows)")
        batched = [j for j in jobs if j[2].batched]
        if batched:
            session = BatchSession(self.target_rows, self.draft_rows, target_width=self.width)

            def done(handle) -> None:
                results[handle.request.tag] = handle.result.text
                bar.update(1)

            for i, ids, d in batched:
                session.admit(row_request(ids, d, on_done=done, tag=i))
            session.run()
        for i, ids, d in (j for j in jobs if not j[2].batched):
            results[i] = self._generate_one(ids, d).text
            bar.update(1)
        bar.close()
        for req, text in zip(requests, results):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return results

    def _generate_one(self, ids: list[int], d: Decode):
        """One request with ``generate`` on single-sequence views of the batched backends' models (their own
        caches on the same weights), or a pair of its own where the backends lend none (made on first use)."""
        if self._single is None:
            from verispec.models import load_pair
            from verispec.models.batch import one_sequence_views

            self._single = one_sequence_views(self.target_rows, self.draft_rows) or \
                tuple(load_pair(self._settings, need_draft=self.draft_rows is not None)[:2])
        return generate_single(*self._single, ids, d)


class _ChatPrompt(str):
    """A rendered chat prompt: its text, and its token ids (special tokens included) in ``ids``."""

    ids: list[int]

    def __new__(cls, text: str, ids: list[int]):
        obj = super().__new__(cls, text)
        obj.ids = list(ids)
        return obj


class _Configured(VerispecLM):
    """:class:`VerispecLM` with :data:`DEFAULTS` (``verispec lm-eval``'s flags) under its ``model_args``."""

    def __init__(self, **kwargs: Any) -> None:
        if "device" in DEFAULTS:        # verispec lm-eval's --device, not lm_eval's (its default is cuda:0)
            kwargs.pop("device", None)
        super().__init__(**{**DEFAULTS, **kwargs})


def register() -> None:
    """Add the ``verispec`` model to lm-eval's registry (registering it again is a no-op)."""
    register_model(MODEL_NAME)(_Configured)
