"""Structured outputs below the server: the spec, compiling with xgrammar, the batched token
mask, and generation through the engine (outputs obey the constraint; unconstrained rows of
the same batch are token-identical to running alone; preemption keeps the matcher)."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch
from transformers import AutoTokenizer

from mmserve import LLM, SamplingParams
from mmserve.engine.admission.grammar import GrammarCompiler, choice_grammar
from mmserve.models.tiny import resolve_model_path
from mmserve.structured_outputs import MAX_JSON_WHITESPACE, StructuredOutputsParams
from mmserve.worker.grammar_mask import GrammarMask, new_matcher

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},  # maxLength admits \t
        "age": {"type": "integer"},
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
    },
    "required": ["name", "age", "city"],
}


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-qwen2-vl"))
    return GrammarCompiler(tokenizer, len(tokenizer) + 6, (tokenizer.eos_token_id,))


def _accepts(compiler: GrammarCompiler, spec: StructuredOutputsParams, text: str) -> bool:
    matcher = new_matcher(compiler.compile(spec).compiled)
    return bool(matcher.accept_string(text)) and bool(matcher.is_completed())


def test_spec_needs_exactly_one_constraint() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="got json, regex"):
        StructuredOutputsParams(json={"type": "object"}, regex="a")
    with pytest.raises(ValueError, match="not valid JSON"):
        StructuredOutputsParams(json="{nope")
    with pytest.raises(ValueError, match="choice"):
        StructuredOutputsParams(choice=[])
    spec = StructuredOutputsParams(json='{"type": "object", "b": 1}')
    assert spec.key == StructuredOutputsParams(json={"b": 1, "type": "object"}).key


def test_constraint_kinds_accept_what_they_should(compiler: GrammarCompiler) -> None:
    ok = '{"name": "Ann", "age": 3, "city": "Rome"}'
    assert _accepts(compiler, StructuredOutputsParams(json=SCHEMA), ok)
    assert not _accepts(compiler, StructuredOutputsParams(json=SCHEMA), ok.replace("Rome", "Oslo"))
    anything = StructuredOutputsParams(json_object=True)
    assert _accepts(compiler, anything, '{"any": [1, {"b": null}], "keys": "ok"}')
    assert not _accepts(compiler, anything, "[1, 2]")
    assert _accepts(compiler, StructuredOutputsParams(regex=r"\d{3}-[a-z]+"), "123-abc")
    assert not _accepts(compiler, StructuredOutputsParams(regex=r"\d{3}-[a-z]+"), "12-abc")
    choice = StructuredOutputsParams(choice=["yes", 'say "no"', "naïve\n"])
    assert all(_accepts(compiler, choice, c) for c in ["yes", 'say "no"', "naïve\n"])
    assert not _accepts(compiler, choice, "ye")
    assert _accepts(compiler, StructuredOutputsParams(grammar=choice_grammar(["a"])), "a")


def test_json_whitespace_is_bounded(compiler: GrammarCompiler) -> None:
    """Unbounded whitespace lets a small model emit spaces forever inside the object."""
    spec = StructuredOutputsParams(json_object=True)
    assert _accepts(compiler, spec, "{" + " " * MAX_JSON_WHITESPACE + '"a": 1}')
    assert not _accepts(compiler, spec, "{" + " " * (MAX_JSON_WHITESPACE + 1) + '"a": 1}')


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "nope"}}}),
        StructuredOutputsParams(regex="(unclosed"),
        StructuredOutputsParams(grammar="root ::= "),
    ],
)
def test_invalid_constraints_are_value_errors(compiler: GrammarCompiler, spec) -> None:
    with pytest.raises(ValueError, match=f"structured_outputs {spec.kind} cannot be compiled"):
        compiler.compile(spec)


def test_mask_touches_only_constrained_rows(compiler: GrammarCompiler) -> None:
    tokenizer = compiler.tokenizer
    spec = compiler.compile(StructuredOutputsParams(choice=["Paris", "Rome"]))
    matchers = [None, new_matcher(spec.compiled), None]
    logits = torch.randn(3, compiler.vocab_size, dtype=torch.bfloat16)
    masked = GrammarMask().apply(logits, matchers)
    assert torch.equal(masked[[0, 2]], logits[[0, 2]].float())
    allowed = torch.isfinite(masked[1]).nonzero().flatten().tolist()
    texts = {tokenizer.decode([t]) for t in allowed}
    assert texts and all("Paris".startswith(t) or "Rome".startswith(t) for t in texts)
    GrammarMask.advance(matchers, [5, allowed[0], 7])
    assert not matchers[1].is_terminated()


def test_unconstrained_requests_do_not_pay_for_the_mask() -> None:
    calls = []

    class Spy(GrammarMask):
        def apply(self, logits, matchers):
            calls.append(len(matchers))
            return super().apply(logits, matchers)

    llm = LLM("tiny-qwen2-vl")
    llm.engine.runner.grammar = Spy()
    llm.generate(["a plain prompt"], SamplingParams(temperature=0, max_tokens=4))
    assert calls == []


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-qwen2-vl")


def _constrained(spec: StructuredOutputsParams, max_tokens: int = 60) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=spec)


def test_generation_obeys_each_constraint(llm: LLM) -> None:
    prompts = ["Describe a person as JSON:", "Pick a city:", "A code:", "Any JSON:"]
    any_json = StructuredOutputsParams(json_object=True)
    params = [
        _constrained(StructuredOutputsParams(json=SCHEMA), 200),
        _constrained(StructuredOutputsParams(choice=["Paris", "Rome", "Berlin"])),
        _constrained(StructuredOutputsParams(regex=r"[A-Z]{2}-\d{4}")),
        SamplingParams(temperature=0.8, seed=3, max_tokens=40, structured_outputs=any_json),
    ]  # fmt: skip
    outs = [o.outputs[0] for o in llm.generate(prompts, params)]
    assert all(o.finish_reason == "stop" for o in outs[:3]), [o.text for o in outs]
    person = json.loads(outs[0].text)
    assert set(person) >= {"name", "age", "city"} and person["city"] in ("Paris", "Rome")
    assert outs[1].text in ("Paris", "Rome", "Berlin")
    assert re.fullmatch(r"[A-Z]{2}-\d{4}", outs[2].text)
    # a random model's free-form object need not close within 40 tokens: what it wrote so far
    # is a valid start of one (the matcher accepts it)
    matcher = new_matcher(llm.engine.grammar.compile(any_json).compiled)
    assert outs[3].text.startswith("{") and matcher.accept_string(outs[3].text)
    if outs[3].finish_reason == "stop":
        assert isinstance(json.loads(outs[3].text), dict)


def test_unconstrained_rows_are_unchanged_by_constrained_neighbours(llm: LLM) -> None:
    plain = SamplingParams(temperature=0, max_tokens=16)
    alone = llm.generate(["Tell me about cubes."], plain)[0].outputs[0].token_ids
    mixed = llm.generate(
        ["Tell me about cubes.", "Pick:"],
        [plain, _constrained(StructuredOutputsParams(choice=["x", "y"]))],
    )
    assert mixed[0].outputs[0].token_ids == alone
    assert mixed[1].outputs[0].text in ("x", "y")


def test_matcher_survives_preemption() -> None:
    """A KV cache too small for all requests at once forces preemption mid-output."""
    small = LLM("tiny-qwen2-vl", num_kv_blocks=12, block_size=16, max_model_len=192)
    spec = StructuredOutputsParams(regex=r"(ab ){40}end")
    prompts = [f"request {i}:" for i in range(4)]
    outs = small.generate(prompts, _constrained(spec, 200))
    assert small.engine.scheduler.counters["num_preemptions"] > 0
    for out in outs:
        assert out.outputs[0].text == "ab " * 40 + "end"


def test_a_grammar_that_completes_before_min_tokens_ends_the_request(llm: LLM) -> None:
    """The grammar allows only EOS once it is complete; min_tokens bans EOS until then. The
    grammar wins (the output stays valid and ends), instead of every token being masked."""
    spec = StructuredOutputsParams(choice=["Paris", "Rome"])
    short = llm.generate("Pick a city:", _constrained(spec))[0].outputs[0]
    params = SamplingParams(temperature=0, max_tokens=30, min_tokens=20, structured_outputs=spec)
    out = llm.generate("Pick a city:", params)[0].outputs[0]
    assert out.token_ids == short.token_ids and out.finish_reason == "stop"


def test_without_xgrammar_a_constraint_is_a_value_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """xgrammar is the ``structured`` extra: without it a constrained request is refused in one
    line that says what to install, and an unconstrained one runs."""
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` fails as if absent
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-qwen2-vl"))
    compiler = GrammarCompiler(tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    with pytest.raises(ValueError, match=r"needs 'xgrammar'.*pip install 'mmserve\[structured\]'"):
        compiler.compile(StructuredOutputsParams(json_object=True))
    llm = LLM(model="tiny-qwen2-vl")
    constrained = SamplingParams(
        temperature=0, max_tokens=4, structured_outputs=StructuredOutputsParams(regex="[ab]+")
    )
    with pytest.raises(ValueError, match=r"mmserve\[structured\]"):
        llm.generate(["Hello"], constrained)
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4
