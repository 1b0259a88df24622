"""The cache prediction and the checkpoint rules of `domain.prompt_cache`, over token lists."""

from __future__ import annotations

import random

import pytest

from domain.completion import Completion, Timings
from domain.events import CacheCause, CachePrediction
from domain.llama_api import Props
from domain.messages import AssistantMessage, ChatRequest, SystemMessage, ToolCall, ToolSchema, UserMessage
from domain.prompt_cache import (
    COVER_TAIL,
    Checkpoint,
    Rendered,
    SlotTurn,
    checkpoint_filename,
    common_prefix,
    covered,
    covers,
    predict,
    prompt_digest,
    restore_refusal,
)

LOSS = 64
SYSTEM = SystemMessage("You are terse.")
ASK = UserMessage("Name three colours.")
FIRST = ChatRequest(slot=0, messages=(SYSTEM, ASK))
PROMPT1 = list(range(1000, 1300))  # 300 tokens
TEXT1 = "<sys>You are terse.</sys><user>Name three colours.</user><assistant>"
ANSWER = "Red, blue and green."


def completion(content: str | None = ANSWER, reasoning: str | None = None, predicted: int = 100) -> Completion:
    return Completion(
        id="c", content=content, reasoning_content=reasoning, timings=Timings(0, 400 - predicted, predicted)
    )


def turn(reasoning: str | None = None, content: str | None = ANSWER, req: ChatRequest = FIRST) -> SlotTurn:
    return SlotTurn.of(req, b"{}", Rendered.of(TEXT1, PROMPT1), completion(content, reasoning))


def follow_up(*messages: object, **changes: object) -> ChatRequest:
    extra = messages or (AssistantMessage(ANSWER), UserMessage("And three more."))
    return ChatRequest(slot=0, messages=(SYSTEM, ASK, *extra), **changes)  # type: ignore[arg-type]


def rendered(tokens: list[int], text: str) -> Rendered:
    return Rendered.of(text, tokens)


BEFORE = Rendered.of(TEXT1, PROMPT1)
EXTENDED = rendered(PROMPT1 + list(range(5000, 5120)), TEXT1 + ANSWER + "</assistant><user>And three more.</user>")


# -- common_prefix ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([], [], 0),
        ([1, 2, 3], [], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2, 3, 4], 3),
        ([1, 2, 3, 4], [1, 2, 3], 3),
        ([9, 2, 3], [1, 2, 3], 0),
        ([1, 2, 3], [1, 2, 4], 2),
        ([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 8], 6),
    ],
)
def test_common_prefix_of_two_token_lists(a: list[int], b: list[int], expected: int) -> None:
    assert common_prefix(a, b) == expected
    assert common_prefix(b, a) == expected


def test_common_prefix_agrees_with_a_walk_over_random_lists() -> None:
    rng = random.Random(7)
    for _ in range(500):
        size = rng.randrange(0, 60)
        a = [rng.randrange(3) for _ in range(size)]
        b = a[: rng.randrange(0, size + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 10))]
        walked = 0
        while walked < min(len(a), len(b)) and a[walked] == b[walked]:
            walked += 1
        assert common_prefix(Rendered.of("", a).tokens, Rendered.of("", b).tokens) == walked


# -- predict ------------------------------------------------------------------------------------


def test_a_turn_that_extends_the_previous_one_reuses_all_the_slot_holds() -> None:
    prediction = predict(turn(), BEFORE, follow_up(), EXTENDED, held=399, loss_tokens=LOSS)
    # the previous request left 300 + 100 tokens; its last token was sampled, never decoded
    assert prediction == CachePrediction(reused=399, previous=400, lost=False)


def test_without_a_slot_reading_the_extension_is_predicted_from_the_timings() -> None:
    prediction = predict(turn(), BEFORE, follow_up(), EXTENDED, held=None, loss_tokens=LOSS)
    assert (prediction.reused, prediction.lost) == (399, False)


def test_a_changed_system_prompt_loses_all_after_the_divergence_and_names_message_0() -> None:
    changed = ChatRequest(slot=0, messages=(SystemMessage("Be verbose."), ASK, AssistantMessage(ANSWER)))
    now = rendered(PROMPT1[:3] + [7] * 400, "<sys>Be verbose.")
    prediction = predict(turn(), BEFORE, changed, now, held=399, loss_tokens=LOSS)
    assert prediction == CachePrediction(3, 400, True, 0, CacheCause.MESSAGE_CHANGED)


def test_a_changed_later_message_is_named_by_its_index() -> None:
    changed = ChatRequest(slot=0, messages=(SYSTEM, UserMessage("Name four colours."), AssistantMessage(ANSWER)))
    now = rendered(PROMPT1[:250] + [7] * 100, "x")
    prediction = predict(turn(), BEFORE, changed, now, held=399, loss_tokens=LOSS)
    assert (prediction.reused, prediction.message, prediction.cause) == (250, 1, CacheCause.MESSAGE_CHANGED)


def test_a_request_that_drops_messages_names_the_first_one_missing() -> None:
    shorter = ChatRequest(slot=0, messages=(SYSTEM,))
    now = rendered(PROMPT1[:100], "x")
    prediction = predict(turn(), BEFORE, shorter, now, held=399, loss_tokens=LOSS)
    assert (prediction.message, prediction.cause) == (1, CacheCause.MESSAGE_CHANGED)


def test_changed_tools_are_the_cause_before_any_message() -> None:
    tool = ToolSchema("f", "d", {"type": "object"})
    now = rendered(PROMPT1[:10] + [7] * 300, "x")
    prediction = predict(turn(), BEFORE, follow_up(tools=(tool,)), now, held=399, loss_tokens=LOSS)
    assert (prediction.message, prediction.cause) == (None, CacheCause.OPTIONS_CHANGED)
    thinking = predict(turn(), BEFORE, follow_up(thinking=True), now, held=399, loss_tokens=LOSS)
    assert thinking.cause is CacheCause.OPTIONS_CHANGED


def test_reasoning_the_template_drops_is_named_at_the_previous_answer() -> None:
    # the generation prompt opened a think block; the next render of that turn has none, so the
    # prompts part 4 tokens before the previous prompt's end and the whole answer is lost
    thought = turn(reasoning="I think of the sky, grass and blood.")
    now = rendered(PROMPT1[:296] + [7] * 150, "x")
    prediction = predict(thought, BEFORE, follow_up(), now, held=399, loss_tokens=LOSS)
    assert prediction == CachePrediction(296, 400, True, 2, CacheCause.REASONING_DROPPED)


def test_a_template_that_renders_the_turn_differently_without_reasoning_has_no_cause() -> None:
    now = rendered(PROMPT1[:296] + [7] * 150, "x")
    prediction = predict(turn(), BEFORE, follow_up(), now, held=399, loss_tokens=LOSS)
    assert (prediction.reused, prediction.message, prediction.cause) == (296, 2, None)


def test_a_prompt_that_keeps_the_previous_one_but_not_the_answer_reuses_the_prompt_alone() -> None:
    other = follow_up(AssistantMessage("Something else."), UserMessage("More."))
    now = rendered(PROMPT1 + [7] * 100, TEXT1 + "Something else.</assistant>")
    prediction = predict(turn(), BEFORE, other, now, held=399, loss_tokens=LOSS)
    assert prediction == CachePrediction(300, 400, True, 2, CacheCause.MESSAGE_CHANGED)


def test_an_answer_sent_back_as_generated_but_without_its_reasoning_names_the_reasoning() -> None:
    thought = turn(reasoning="Sky, grass, blood: three colours.")
    now = rendered(PROMPT1 + [7] * 100, TEXT1 + ANSWER)
    prediction = predict(thought, BEFORE, follow_up(), now, held=399, loss_tokens=LOSS)
    assert prediction == CachePrediction(300, 400, True, 2, CacheCause.REASONING_DROPPED)


def test_reasoning_the_template_keeps_is_reused() -> None:
    thought = turn(reasoning="Sky, grass, blood: three colours.")
    now = rendered(PROMPT1 + [7] * 120, TEXT1 + "\nSky, grass, blood: three colours.</think>" + ANSWER)
    prediction = predict(thought, BEFORE, follow_up(), now, held=399, loss_tokens=LOSS)
    assert (prediction.reused, prediction.lost) == (399, False)


def test_an_answer_that_is_not_sent_back_at_all_is_a_changed_message() -> None:
    now = rendered(PROMPT1 + [7] * 10, TEXT1 + "<user>")
    prediction = predict(turn(), BEFORE, follow_up(UserMessage("again")), now, held=399, loss_tokens=LOSS)
    assert (prediction.message, prediction.cause) == (2, CacheCause.MESSAGE_CHANGED)


def test_a_tool_call_answer_sent_back_with_other_arguments_is_a_changed_message() -> None:
    call = ToolCall("1", "f", '{"a": 1}')
    previous = SlotTurn.of(FIRST, b"{}", BEFORE, Completion("c", None, None, (call,), timings=Timings(0, 300, 100)))
    sent = follow_up(AssistantMessage(None, None, [ToolCall("1", "f", '{"a": 2}')]))
    now = rendered([*PROMPT1, 7], TEXT1 + "<call>")
    assert predict(previous, BEFORE, sent, now, held=399, loss_tokens=LOSS).cause is CacheCause.MESSAGE_CHANGED
    same = follow_up(AssistantMessage(None, None, [call]))  # a list equals the tuple it came as
    assert predict(previous, BEFORE, same, now, held=399, loss_tokens=LOSS).cause is None


def test_an_emptied_slot_caps_the_reuse_and_is_the_cause() -> None:
    prediction = predict(turn(), BEFORE, follow_up(), EXTENDED, held=0, loss_tokens=LOSS)
    assert prediction == CachePrediction(0, 400, True, None, CacheCause.SLOT_EMPTIED)
    changed = ChatRequest(slot=0, messages=(SystemMessage("Be verbose."),))
    emptied = predict(turn(), BEFORE, changed, rendered(PROMPT1[:200], "x"), held=0, loss_tokens=LOSS)
    assert (emptied.reused, emptied.cause) == (0, CacheCause.SLOT_EMPTIED)


def test_a_slot_holding_a_few_tokens_less_keeps_the_divergence_as_the_cause() -> None:
    now = rendered(PROMPT1[:200] + [7] * 10, "x")
    changed = ChatRequest(slot=0, messages=(SYSTEM, UserMessage("Other.")))
    prediction = predict(turn(), BEFORE, changed, now, held=200 - LOSS, loss_tokens=LOSS)
    assert (prediction.reused, prediction.message, prediction.cause) == (136, 1, CacheCause.MESSAGE_CHANGED)
    emptier = predict(turn(), BEFORE, changed, now, held=200 - LOSS - 1, loss_tokens=LOSS)
    assert (emptier.reused, emptier.cause) == (135, CacheCause.SLOT_EMPTIED)


def test_a_shortfall_of_exactly_the_loss_limit_is_no_loss_and_names_nothing() -> None:
    prompt = list(range(380))
    previous = SlotTurn.of(FIRST, b"{}", Rendered.of("p", prompt), completion(predicted=20))
    changed = ChatRequest(slot=0, messages=(SYSTEM, UserMessage("Other.")))
    before = Rendered.of("p", prompt)
    kept = predict(previous, before, changed, rendered([*prompt[:336], -1], "q"), None, LOSS)
    assert kept == CachePrediction(336, 400, False)  # 64 short of the 380 + 20 the slot was left
    short = predict(previous, before, changed, rendered([*prompt[:335], -1], "q"), None, LOSS)
    assert (short.lost, short.message, short.cause) == (True, 1, CacheCause.MESSAGE_CHANGED)


def test_a_restore_is_carried_in_the_prediction() -> None:
    prediction = predict(turn(), BEFORE, follow_up(), EXTENDED, held=399, loss_tokens=LOSS, restored=399)
    assert (prediction.reused, prediction.restored, prediction.lost) == (399, 399, False)


def test_the_slot_turn_remembers_the_answer_start_reasoning_first() -> None:
    assert turn().answer_start == ANSWER
    assert turn(reasoning="  Thinking first.  ").answer_start == "Thinking first."
    assert turn(reasoning="x" * 100).answer_start == "x" * 64
    assert turn(reasoning="   ").thought is False
    assert turn(reasoning="hm").thought is True
    assert turn().total == 400


# -- checkpoints --------------------------------------------------------------------------------

PROPS = Props("template", "a" * 64, total_slots=2, n_ctx=4096, model_alias="m", model_path="/models/m.gguf")


def checkpoint(**changes: object) -> Checkpoint:
    fields: dict[str, object] = {
        "slot": 0,
        "filename": checkpoint_filename(0, "m"),
        "tokens": 399,
        "bytes": 1 << 20,
        "template_sha256": "a" * 64,
        "model": "/models/m.gguf",
        "n_ctx": 4096,
        "prompt_tokens": 300,
        "prompt_sha256": prompt_digest(PROMPT1),
    }
    fields.update(changes)
    return Checkpoint(**fields)  # type: ignore[arg-type]


def test_a_checkpoint_restores_into_the_server_it_was_saved_from() -> None:
    assert restore_refusal(checkpoint(), PROPS, None) is None
    assert restore_refusal(checkpoint(), PROPS, [*PROMPT1, 1, 2, 3]) is None
    assert restore_refusal(checkpoint(), PROPS, PROMPT1) is None


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"template_sha256": "b" * 64}, "chat template"),
        ({"model": "/models/other.gguf"}, "another model"),
        ({"n_ctx": 8192}, "slot context is 4096, not 8192"),
    ],
)
def test_a_checkpoint_from_another_server_is_refused_and_says_why(changes: dict[str, object], words: str) -> None:
    refusal = restore_refusal(checkpoint(**changes), PROPS, PROMPT1)
    assert refusal is not None and words in refusal


def test_a_checkpoint_is_refused_before_a_request_that_does_not_begin_with_its_prompt() -> None:
    assert "does not begin" in str(restore_refusal(checkpoint(), PROPS, PROMPT1[:299]))
    assert "does not begin" in str(restore_refusal(checkpoint(), PROPS, [0, *PROMPT1]))


def test_a_checkpoint_with_no_prompt_on_record_goes_back_only_by_hand() -> None:
    # Saved while nothing this client sent was on record: it fits no request it can name.
    empty = checkpoint(prompt_tokens=0, prompt_sha256=prompt_digest([]))
    assert restore_refusal(empty, PROPS, [5]) == "it has no prompt on record (only restore_slot puts it back)"
    assert restore_refusal(empty, PROPS, None) is None


def test_the_model_falls_back_to_the_alias_and_the_file_names_the_slot() -> None:
    alias_only = Props("template", "a" * 64, total_slots=2, n_ctx=4096, model_alias="m")
    assert restore_refusal(checkpoint(model="m"), alias_only, None) is None
    name = checkpoint_filename(3, "m")
    assert name.startswith("inferpath-") and name.endswith("-slot-3.bin") and "/" not in name
    # A router's models share one save folder: each model's slot 3 has a file of its own.
    assert checkpoint_filename(3, "other") != name != checkpoint_filename(2, "m")
    assert prompt_digest([1, 2]) != prompt_digest([2, 1])


def test_a_checkpoint_covers_its_prompt_but_the_generation_prompt_at_its_end() -> None:
    count, digest = covered(PROMPT1)
    assert count == 300 - COVER_TAIL
    assert digest == prompt_digest(PROMPT1[: 300 - COVER_TAIL])
    assert covered(PROMPT1[:5]) == (0, prompt_digest([]))
    saved = checkpoint(prompt_tokens=count, prompt_sha256=digest)
    # the next turn may tokenize the prompt's last tokens differently where the answer meets them
    assert covers(saved, [*PROMPT1[:-1], 7, 8, 9])
    assert not covers(saved, PROMPT1[: count - 1])
    assert not covers(saved, [0, *PROMPT1])


def test_a_message_whose_kind_changed_is_a_changed_message() -> None:
    changed = ChatRequest(slot=0, messages=(UserMessage(SYSTEM.content), ASK, AssistantMessage(ANSWER)))
    now = rendered(PROMPT1[:2] + [7] * 300, "x")
    prediction = predict(turn(), BEFORE, changed, now, held=399, loss_tokens=LOSS)
    assert (prediction.message, prediction.cause) == (0, CacheCause.MESSAGE_CHANGED)


def test_the_same_messages_rendered_differently_name_the_turn_after_them() -> None:
    # the template renders the very same messages otherwise (a date in it, say)
    now = rendered(PROMPT1[:250] + [7] * 60, "x")
    prediction = predict(turn(), BEFORE, FIRST, now, held=399, loss_tokens=LOSS)
    assert (prediction.reused, prediction.message, prediction.cause) == (250, 2, None)


def test_the_same_request_again_reuses_its_prompt_and_names_the_missing_answer() -> None:
    prediction = predict(turn(), BEFORE, FIRST, BEFORE, held=399, loss_tokens=LOSS)
    assert prediction == CachePrediction(300, 400, True, 2, CacheCause.MESSAGE_CHANGED)


def test_an_answer_sent_back_but_rendered_otherwise_without_reasoning_has_no_cause() -> None:
    now = rendered(PROMPT1 + [7] * 100, TEXT1 + "- " + ANSWER)
    prediction = predict(turn(), BEFORE, follow_up(), now, held=399, loss_tokens=LOSS)
    assert prediction == CachePrediction(300, 400, True, 2, None)


def test_a_tool_call_answer_sent_back_as_made_is_reused_whole() -> None:
    call = ToolCall("1", "f", '{"a": 1}')
    previous = SlotTurn.of(FIRST, b"{}", BEFORE, Completion("c", None, None, (call,), timings=Timings(0, 300, 100)))
    now = rendered([*PROMPT1, 7], TEXT1 + "<call>")
    prediction = predict(previous, BEFORE, follow_up(AssistantMessage(None, None, [call])), now, 399, LOSS)
    assert (prediction.reused, prediction.lost) == (399, False)


def test_another_conversation_with_other_options_is_named_at_its_first_changed_message() -> None:
    # The slot's last request came from another conversation, whose tool_choice differed too:
    # the prompts part at the first message that differs, and that is the cause to name.
    other = ChatRequest(slot=0, messages=(SYSTEM, UserMessage("Name a city.")), tool_choice="none")
    now = rendered(PROMPT1[:250] + [7] * 100, "x")
    prediction = predict(turn(), BEFORE, other, now, held=399, loss_tokens=LOSS)
    assert (prediction.message, prediction.cause) == (1, CacheCause.MESSAGE_CHANGED)


def test_a_tokenizer_that_disagrees_with_the_servers_count_never_claims_more_than_the_slot_held() -> None:
    # A hostile or inconsistent /tokenize: 200,000 tokens for a previous turn of 400.
    huge = rendered(list(range(200_000)), TEXT1)
    longer = rendered(
        [*range(200_000), *range(5000, 5100)], TEXT1 + ANSWER + "</assistant><user>And three more.</user>"
    )
    prediction = predict(turn(), huge, follow_up(), longer, held=None, loss_tokens=LOSS)
    assert prediction.reused <= prediction.previous == 400
