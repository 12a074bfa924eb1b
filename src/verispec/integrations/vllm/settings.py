"""How an engine and its requests choose a verispec rule (no vLLM import).

Per engine: ``LLM(..., additional_config={"verispec": {"rule": "lenience:ell=0.5"}})`` (``vllm serve
--additional-config '{"verispec": {"rule": "..."}}'``), or the environment variable ``VERISPEC_VLLM_RULE``
when the config names none. Without either the plug-in leaves vLLM's own rejection sampler in place, so
installing verispec changes nothing until it is asked for.

Per request: ``SamplingParams(extra_args={"verispec_rule": "speccascade:p_base=0.3"})`` overrides the
engine's rule (``"vllm"`` keeps vLLM's own sampler for that request); ``"verispec_rule"`` is refused at
admission on an engine whose settings say ``request_rules: false``, or that runs without the plug-in.

True baselines (on an engine without speculative decoding, :mod:`.baseline`):
``extra_args={"verispec_baseline": "<rule spec>", "verispec_top_k": k, "verispec_top_p": p}``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from verispec.integrations.vllm.support import NATIVE, Proposer, check_rule
from verispec.rules.base import Rule

#: The key of the plug-in's settings in vLLM's ``additional_config``.
CONFIG_KEY = "verispec"
ENV_RULE = "VERISPEC_VLLM_RULE"
#: ``SamplingParams.extra_args`` keys read by the plug-in.
REQUEST_RULE = "verispec_rule"
REQUEST_BASELINE = "verispec_baseline"
REQUEST_TOP_K = "verispec_top_k"
REQUEST_TOP_P = "verispec_top_p"

_KEYS = ("rule", "request_rules")


@dataclass(frozen=True)
class PluginSettings:
    """The plug-in's settings for one engine: the default ``rule`` (a rule spec or ``"vllm"``) and whether
    requests may choose their own (``request_rules``)."""

    rule: str = "lossless"
    request_rules: bool = True

    @classmethod
    def from_additional_config(cls, additional_config: object) -> PluginSettings | None:
        """The settings in vLLM's ``additional_config`` (or ``$VERISPEC_VLLM_RULE``); None: plug-in off."""
        raw = additional_config.get(CONFIG_KEY) if isinstance(additional_config, dict) else None
        if raw is None:
            env = os.environ.get(ENV_RULE, "").strip()
            return cls(rule=env) if env else None
        if isinstance(raw, str):
            raw = {"rule": raw}
        if not isinstance(raw, dict):
            raise ValueError(f"additional_config[{CONFIG_KEY!r}] must be a dict like {{'rule': 'lossless'}}, "
                             f"got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(_KEYS))
        if unknown:
            raise ValueError(f"additional_config[{CONFIG_KEY!r}]: unknown key(s) {', '.join(unknown)}; valid keys: "
                             f"{', '.join(_KEYS)}")
        rule = raw.get("rule", "lossless")
        if not isinstance(rule, str) or not rule.strip():
            raise ValueError(f"additional_config[{CONFIG_KEY!r}]['rule'] must be a rule spec (e.g. 'lossless') or "
                             f"{NATIVE!r}, got {rule!r}")
        request_rules = raw.get("request_rules", True)
        if not isinstance(request_rules, bool):
            raise ValueError(f"additional_config[{CONFIG_KEY!r}]['request_rules'] must be true or false")
        return cls(rule=rule.strip(), request_rules=request_rules)

    def to_additional_config(self) -> dict:
        return {CONFIG_KEY: {"rule": self.rule, "request_rules": self.request_rules}}


def request_rule(extra_args: dict | None) -> str | None:
    """The rule spec a request asks for in ``extra_args`` (None: the engine's)."""
    if not extra_args or REQUEST_RULE not in extra_args:
        return None
    spec = extra_args[REQUEST_RULE]
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"extra_args[{REQUEST_RULE!r}] must be a rule spec such as 'lenience:ell=0.5' or "
                         f"{NATIVE!r}, got {spec!r}")
    return spec.strip()


class RuleBook:
    """Rules of one engine: its default and the per-request ones, checked against the drafts the engine's
    proposer produces (``drafts``: ``"probabilistic"`` or ``"point_mass"``) and cached by spec.
    A rule of None means vLLM's own rejection sampler."""

    def __init__(self, settings: PluginSettings, drafts: str) -> None:
        self.settings, self.drafts = settings, drafts
        self._rules: dict[str, Rule | None] = {}
        self.default = self.resolve(settings.rule)

    def resolve(self, spec: str) -> Rule | None:
        """The rule of ``spec`` (None for ``"vllm"``); ``ValueError`` when this engine's drafts cannot run it."""
        if spec not in self._rules:
            self._rules[spec] = None if spec.strip().lower() == NATIVE else check_rule(spec, self.drafts)
        return self._rules[spec]

    def for_request(self, extra_args: dict | None) -> Rule | None:
        spec = request_rule(extra_args)
        if spec is None:
            return self.default
        if not self.settings.request_rules:
            raise ValueError(f"this engine verifies every request with {self.settings.rule!r} (request_rules is "
                             f"false in additional_config[{CONFIG_KEY!r}]); drop extra_args[{REQUEST_RULE!r}]")
        return self.resolve(spec)


def rule_book(vllm_config) -> RuleBook | None:
    """The engine's rules from its ``VllmConfig`` (None: the plug-in is off, or the engine does not decode
    speculatively); ``ValueError`` when its rule cannot verify its proposer's drafts."""
    settings = PluginSettings.from_additional_config(getattr(vllm_config, "additional_config", None))
    spec_config = getattr(vllm_config, "speculative_config", None)
    if settings is None or spec_config is None:
        return None
    return RuleBook(settings, Proposer.from_config(spec_config).drafts)
