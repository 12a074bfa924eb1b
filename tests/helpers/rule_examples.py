"""The table of the rule suite (tests/test_rule_registry.py): every registered rule with example specs covering
its settings, the specs the registry must refuse, the constructor calls that must fail, other spellings, and the
chain regimes that differ from the default. A rule added to ``verispec.rules.REGISTRY`` without entries here
fails ``test_every_registered_rule_is_in_every_table``."""

from __future__ import annotations

#: Every registered rule -> example specs covering its parameter settings (lossless settings included).
EXAMPLES: dict[str, list[str]] = {
    "lossless": ["lossless"],
    "block": ["block"],
    "hsd": ["hsd"],
    "hsd_uncapped_final": ["hsd_uncapped_final"],
    "hsd_mincap": ["hsd_mincap", "hsd_mincap:ell=0.6"],
    "hsd_nocap": ["hsd_nocap", "hsd_nocap:ell=0.6"],
    "fly": ["fly:theta=0.3,window=1", "fly:theta=0,window=2"],
    "greedy": ["greedy"],
    "lenience": ["lenience:ell=0.3", "lenience:ell=0.8", "lenience:ell=1"],
    "cos_we": ["cos_we:lam=0.3", "cos_we:lam=0.8", "cos_we:lam=1"],
    "cos_cd": ["cos_cd:mu=0.1", "cos_cd:mu=0.6", "cos_cd:mu=0"],
    "ceiling": ["ceiling:kappa=2", "ceiling:kappa=1.5,base=we,lam=0.3", "ceiling:kappa=3,base=cd,mu=0.5",
                "ceiling:kappa=1"],
    "speccascade": ["speccascade:p_base=0.1", "speccascade:p_base=0.3", "speccascade:p_base=0.5",
                    "speccascade:p_base=0.9", "speccascade:p_base=0"],
    "cascade": ["cascade:rule=chow,alpha=0.5", "cascade:rule=diff,alpha=0.2", "cascade:rule=opt,alpha=0.5",
                "cascade:rule=token_v1,alpha=0.3", "cascade:rule=token_v2,alpha=0.3",
                "cascade:rule=token_v3,alpha=0.6"],
    "typical": ["typical:eps=0.05", "typical:eps=0.1", "typical:eps=0.25", "typical:eps=0.2,delta=0.9"],
    "truncation": [
        "truncation:top_k=3", "truncation:top_p=0.7", "truncation:min_p=0.3", "truncation:eta=0.05",
        "truncation:epsilon=0.05", "truncation:prob_gap=0.2", "truncation:top_k=4,top_p=0.8",
        "truncation:top_k=5,min_p=0.2,epsilon=0.01", "truncation:top_p=0.9,eta=0.1,eta_delta=0.5",
        "truncation:prob_gap=0.5,top_k=6,top_p=0.95,min_p=0.05,eta=0.02,epsilon=0.01",
    ],
    "relaxed": ["relaxed:top_k=3,delta=0.2", "relaxed:top_k=2,delta=1"],
    "bild": ["bild:alpha=2.5"],
    "judge": ["judge:name=half_max", "judge:name=soft"],
    "sglang": ["sglang:single=0.9,acc=0.9", "sglang:single=0.3,acc=0.5", "sglang:single=1,acc=0.4",
               "sglang:single=0.2,acc=1", "sglang"],
    "strict": ["strict"],
    "hf_ensemble": ["hf_ensemble:weight=0.3"],
    "fuzzy": [
        "fuzzy:T=0.2",                          # js: opens dense, near_identical, identical, tail_overshoot
        "fuzzy:T=0.7,div=js",                   # T > ln 2: every row open, disjoint supports included
        "fuzzy:T=0.5,div=tv", "fuzzy:T=1,div=kl_qp", "fuzzy:T=0.8,div=kl_pq", "fuzzy:T=0.3,div=js_rev",
        "fuzzy:T=0", "fuzzy:T=0,div=kl_pq", "fuzzy:T=0,div=tv",   # lossless
        "fuzzy:T=0.1,on=raw",                   # the gate reads the raw pair (RAW_OF)
    ],
    "kl_judge": [
        "kl_judge:tau=0.8",                     # one_hot_p is confident: SD there
        "kl_judge:tau=1.5,div=kl_qp,reject=p", "kl_judge:tau=0.8,reject=p",
        "kl_judge:tau=0.7,confident=0.5",       # dense (max p 0.67) is confident: SD there
        "kl_judge:tau=3,confident=1,reject=p",  # no confidence mask
        "kl_judge:tau=0", "kl_judge:tau=0,reject=p", "kl_judge:tau=2,confident=0",
        "kl_judge:tau=2,confident=0,reject=p",  # lossless (never open, or always SD)
        "kl_judge:tau=0.5,on=raw",
    ],
    "mentored": ["mentored:D=0.05", "mentored:D=0.3", "mentored:D=2", "mentored:alpha=0.4", "mentored:alpha=0",
                 "mentored:alpha=1", "mentored:D=0"],
    "cactus": ["cactus:delta=1", "cactus:delta=0.05", "cactus:delta=0.3", "cactus:delta=20",
               "cactus:delta=0"],           # 0: lossless SD
    "logit_compare": ["logit_compare", "logit_compare:eps=0.5", "logit_compare:eps=3"],
    "reject_to_p": ["reject_to_p"],
}

#: Other spellings of a spec and the canonical spec they build.
SPELLINGS = [
    ("lenience:0.5", "lenience:ell=0.5"), ("ceiling:KAPPA=2,Base=we", "ceiling:kappa=2,base=we,lam=0.5"),
    ("hf_ensemble:0.8", "cos_we:lam=0.8"), ("sglang:0.9,0.8", "sglang:single=0.9,acc=0.8"),
    ("truncation:min_p=0.3,top_k=5,top_p=1", "truncation:top_k=5,min_p=0.3"),
    ("relaxed:3,0.2", "relaxed:top_k=3,delta=0.2"),
    ("fly", "fly:theta=0.3,window=5"), ("fly:0.2,3", "fly:theta=0.2,window=3"), ("hsd_nocap:0.5", "hsd_nocap:ell=0.5"),
    ("fuzzy:0.25,kl_pq,raw", "fuzzy:T=0.25,div=kl_pq,on=raw"), ("FUZZY:t=0.3", "fuzzy:T=0.3,div=js,on=processed"),
    ("kl_judge:0.4,0.8,kl_qp,p,raw", "kl_judge:tau=0.4,confident=0.8,div=kl_qp,reject=p,on=raw"),
    ("mentored", "mentored:D=0.1"), ("mentored:0.25", "mentored:D=0.25"), ("MENTORED:d=0.3", "mentored:D=0.3"),
    ("mentored:D=0.2,alpha=none", "mentored:D=0.2"), ("mentored:alpha=0.35", "mentored:alpha=0.35"),
    ("cascade:alpha=0.5", "cascade:rule=token_v3,alpha=0.5"),
    ("speccascade:0.3", "speccascade:p_base=0.3"), ("typical:0.2,0.5", "typical:eps=0.2,delta=0.5"),
    ("cactus:0.5", "cactus:delta=0.5"), ("CACTUS:Delta=2", "cactus:delta=2"),
    ("logit_compare", "logit_compare:eps=1e-05"), ("logit-compare:0.25", "logit_compare:eps=0.25"),
]

#: Every registered rule -> specs the registry refuses, with the message they must raise.
BAD_PARAMETERS: dict[str, list[tuple[str, str]]] = {
    "lossless": [("lossless:x=1", "unknown parameter 'x'.*lossless takes no parameters")],
    "block": [("block:a=1", "block takes no parameters")],
    "hsd": [("hsd:x=2", "hsd takes no parameters")],
    "hsd_uncapped_final": [("hsd_uncapped_final:ell=0.5", "takes no parameters")],
    "hsd_mincap": [("hsd_mincap:ell=0", "ell must be a number with 0 < ell <= 1")],
    "hsd_nocap": [("hsd_nocap:ell=1.5", "ell must be a number with 0 < ell <= 1")],
    "fly": [("fly:theta=-0.1", "theta must be a number >= 0"), ("fly:window=0", "window must be an integer >= 1"),
            ("fly:window=1.5", "window must be an integer >= 1"), ("fly:eps=1", "unknown parameter"),
            ("fly:theta=nan", "theta must be a number >= 0")],
    "greedy": [("greedy:1", "malformed setting '1'.*greedy takes no parameters")],
    "lenience": [("lenience:lam=0.5", "valid parameters: ell"), ("lenience:ell=1.5", "0 < ell <= 1"),
                 ("lenience:ell=0", "0 < ell <= 1"), ("lenience", "missing required")],
    "cos_we": [("cos_we:lam=2", "lam must be a number with 0 <= lam <= 1"), ("cos_we:lam=-0.1", "lam must be")],
    "cos_cd": [("cos_cd:mu=-1", "mu must be a number with 0 <= mu <= 1"), ("cos_cd:mu=1.5", "mu must be")],
    "ceiling": [("ceiling", "missing required parameter.*kappa.*e.g. ceiling:kappa=2"),
                ("ceiling:kappa=0.5", "kappa must be a number >= 1"),
                ("ceiling:kappa=2,base=xx", "base must be one of p, we, cd"),
                ("ceiling:kappa=2,lam=0.3", "base=p takes no"),
                ("ceiling:kappa=2,base=we,mu=0.3", "base=we takes lam, not mu"),
                ("ceiling:kappa=2,base=cd,lam=0.3", "base=cd takes mu, not lam")],
    "speccascade": [("speccascade", "missing required"), ("speccascade:p_base=1.01", "p_base must be a number with"),
                    ("speccascade:p_base=-0.1", "p_base must be a number with 0 <= p_base <= 1")],
    "cascade": [("cascade:rule=nope,alpha=0.1", "rule must be one of chow, diff, opt, token_v1, token_v2, token_v3"),
                ("cascade:rule=chow,alpha=2", r"alpha=2.0 is out of range for rule=chow; expected 0.0 <= alpha <= 1.0"),
                ("cascade:rule=diff,alpha=-2", "out of range for rule=diff"),
                ("cascade:alpha=x", "alpha must be a real number"),
                ("cascade", "missing required parameter.*alpha")],
    "typical": [("typical:eps=1", "must be a number with"), ("typical:eps=0", "must be a number with"),
                ("typical:eps=1.5", "must be a number with"), ("typical", "missing required parameter.*eps"),
                ("typical:eps=0.1,delta=0", "delta must be a number > 0")],
    "truncation": [
        ("truncation", "at least one truncation step"), ("truncation:top_p=1,min_p=0", "at least one truncation step"),
        ("truncation:foo=1", "valid parameters: prob_gap, top_k, top_p, min_p, eta, eta_delta, epsilon"),
        ("truncation:eta_delta=0.5,top_k=3", "set eta too"), ("truncation:top_k=-1", "top_k must be an integer >= 0"),
        ("truncation:top_p=0", r"top_p must be a finite number in \(0, 1\]"),
        ("truncation:eta=1", r"eta must be a finite number in \[0, 1\)"),
        ("truncation:prob_gap=1.5", r"prob_gap must be a finite number in \[0, 1\]"),
    ],
    "relaxed": [("relaxed:top_k=0,delta=0.5", "top_k must be an integer >= 1"),
                ("relaxed:top_k=3,delta=1.5", "delta must be a number with 0 <= delta <= 1"),
                ("relaxed:top_k=3", "missing required parameter")],
    "bild": [("bild:alpha=0", "alpha must be a number > 0"), ("bild:alpha=-1", "alpha must be a number > 0"),
             ("bild:alpha=1000", "alpha must be")],
    "judge": [("judge", "missing required"),
              ("judge:name=nope", "unknown judge 'nope'; registered judges: .*half_max.*soft"),
              ("judge:name=a b", "name must be a registered judge name")],
    "sglang": [("sglang:single=0", "single must be a number with 0 < single <= 1"),
               ("sglang:single=1.5", "single must be a number with 0 < single <= 1"),
               ("sglang:acc=0", "acc must be a number with 0 < acc <= 1"),
               ("sglang:acc=2", "acc must be a number with 0 < acc <= 1"),
               ("sglang:acc=nan", "acc must be"), ("sglang:theta=0.5", "valid parameters: single, acc")],
    "strict": [("strict:x=1", "strict takes no parameters")],
    "hf_ensemble": [("hf_ensemble", "missing required parameter.*hf_ensemble:weight=0.5"),
                    ("hf_ensemble:weight=1", "0 < weight < 1"), ("hf_ensemble:weight=0", "0 < weight < 1")],
    "fuzzy": [("fuzzy", "missing required parameter.*T.*fuzzy:T=0.4"), ("fuzzy:T=-0.1", "T must be a number >= 0"),
              ("fuzzy:T=nan", "T must be a number >= 0"), ("fuzzy:T=inf", "T must be a number >= 0"),
              ("fuzzy:T=0.3,div=kl", "div must be one of js, kl_qp, kl_pq, tv, js_rev"),
              ("fuzzy:T=0.3,on=logits", "on must be one of processed, raw")],
    "kl_judge": [("kl_judge", "missing required parameter.*tau"), ("kl_judge:tau=-1", "tau must be a number >= 0"),
                 ("kl_judge:tau=0.5,confident=1.5", "confident must be a number with 0 <= confident <= 1"),
                 ("kl_judge:tau=0.5,div=js", "div must be one of kl_pq, kl_qp"),
                 ("kl_judge:tau=0.5,reject=residual", "reject must be one of sd, p"),
                 ("kl_judge:tau=0.5,threshold=2", "unknown parameter 'threshold'")],
    "mentored": [("mentored:D=-0.1", "D must be a number >= 0"), ("mentored:D=nan", "D must be a number >= 0"),
                 ("mentored:D=inf", "D must be a number >= 0"),
                 ("mentored:alpha=1.5", "alpha must be a number with 0 <= alpha <= 1"),
                 ("mentored:alpha=-0.1", "alpha must be a number with 0 <= alpha <= 1"),
                 ("mentored:alpha=half", "alpha must be a number with 0 <= alpha <= 1"),
                 ("mentored:D=0.1,alpha=0.5", "either D .* or alpha .*not both"),
                 ("mentored:budget=0.1", "unknown parameter 'budget'; valid parameters: D, alpha")],
    "cactus": [("cactus", "missing required parameter.*delta.*e.g. cactus:delta=1"),
               ("cactus:delta=-0.1", "delta must be a number >= 0"),
               ("cactus:delta=nan", "delta must be a number >= 0"),
               ("cactus:delta=inf", "delta must be a number >= 0"), ("cactus:delta=big", "delta must be"),
               ("cactus:alpha=0.5", "unknown parameter 'alpha'; valid parameters: delta")],
    "logit_compare": [("logit_compare:eps=-1", "eps must be a number >= 0"),
                      ("logit_compare:eps=inf", "eps must be a number >= 0"),
                      ("logit_compare:margin=0.1", "unknown parameter 'margin'; valid parameters: eps")],
    "reject_to_p": [("reject_to_p:x=1", "reject_to_p takes no parameters")],
}

#: Every registered rule with parameters -> keyword arguments its builder (``REGISTRY[name].build``: the rule's
#: class, or the function the spec calls) must refuse, with the message: built directly, it validates as a spec.
CONSTRUCTOR_CHECKS: dict[str, list[tuple[dict, str]]] = {
    "hsd_mincap": [({"ell": 0.0}, "ell must be"), ({"ell": "0.5"}, "ell must be")],
    "hsd_nocap": [({"ell": 2.0}, "ell must be")],
    "fly": [({"theta": 0.3, "window": 2.0}, "window must be"), ({"theta": float("nan")}, "theta must be")],
    "lenience": [({"ell": 2.0}, "ell must be"), ({"ell": "0.5"}, "ell must be")],
    "cos_we": [({"lam": -0.1}, "lam must be")],
    "cos_cd": [({"mu": 1.5}, "mu must be"), ({"mu": "0.1"}, "mu must be")],
    "ceiling": [({"kappa": 0.5}, "kappa must be"), ({"kappa": 2.0, "base": "we", "mu": 0.3}, "base=we takes lam"),
                ({"kappa": 2.0, "base": "xx"}, "needs base we or cd"), ({"kappa": 2.0, "lam": 0.3}, "base=p takes no"),
                ({"kappa": 0.5, "base": "we"}, "kappa must be")],
    "speccascade": [({"p_base": 1.5}, "p_base must be")],
    "cascade": [({"rule": "nope", "alpha": 0.1}, "rule must be one of"),
                ({"rule": "chow", "alpha": 2.0}, "out of range")],
    "typical": [({"eps": 1.0}, "eps must be"), ({"eps": 0.1, "delta": 0.0}, "delta must be")],
    "truncation": [({"top_k": 2.5}, "top_k"), ({"bogus": 1}, "unknown setting"), ({"top_p": 1.0}, "at least one")],
    "relaxed": [({"top_k": 3, "delta": -0.1}, "delta"), ({"top_k": 0, "delta": 0.5}, "top_k")],
    "bild": [({"alpha": 0.0}, "alpha")],
    "judge": [({"name": "nope"}, "unknown judge"), ({"name": "a,b"}, "name must be")],
    "sglang": [({"single": "0.5"}, "single must be"), ({"acc": -0.1}, "acc must be")],
    "hf_ensemble": [({"weight": 1.0}, "weight must be"), ({"weight": True}, "weight must be")],
    "fuzzy": [({"T": -1.0}, "fuzzy: T must be a number >= 0"), ({"T": "0.3"}, "fuzzy: T must be"),
              ({"T": 0.3, "on": "raw_logits"}, "fuzzy: on must be one of processed, raw")],
    "kl_judge": [({"tau": 0.5, "confident": -0.1}, "kl_judge: confident must be"),
                 ({"tau": 0.5, "on": "raw_logits"}, "kl_judge: on must be one of processed, raw")],
    "mentored": [({"D": -1.0}, "mentored: D must be a number >= 0"), ({"D": "0.1"}, "mentored: D must be"),
                 ({"alpha": 2.0}, "mentored: alpha must be"), ({"D": 0.1, "alpha": 0.5}, "not both")],
    "cactus": [({"delta": -1.0}, "cactus: delta must be a number >= 0"), ({"delta": "0.5"}, "cactus: delta must be"),
               ({"delta": True}, "cactus: delta must be")],
    "logit_compare": [({"eps": -0.5}, "logit_compare: eps must be a number >= 0"),
                      ({"eps": float("nan")}, "logit_compare: eps must be")],
}

#: Chain-semantics regimes (first position, second position) where the default (dense, tail_overshoot) would
#: rarely reach the second position or would not exercise the rule's switch.
CHAIN_CASES = {
    "fuzzy:T=0.2": ("dense", "peaked"),                     # open, then closed (law p2)
    "fuzzy:T=0": ("identical", "near_identical"),           # the lossless gate only opens on p = q
    "fuzzy:T=0,div=kl_pq": ("identical", "dense"),
    "fuzzy:T=0,div=tv": ("identical", "tail_overshoot"),
    "fuzzy:T=0.1,on=raw": ("tail_overshoot", "dense"),
    "kl_judge:tau=0.8": ("peaked", "tail_overshoot"),       # SD (β ≈ 0.51), then open
    "kl_judge:tau=0.8,reject=p": ("one_hot_p", "dense"),    # confident SD (β 0.08), then open
    "kl_judge:tau=0,reject=p": ("one_hot_p", "dense"),      # confident SD, then a closed gate (law p)
    "fuzzy:T=0.5,div=tv": ("tail_overshoot", "dense"),       # open, then closed
    "mentored:alpha=0.4": ("peaked", "one_hot_q"),
}
