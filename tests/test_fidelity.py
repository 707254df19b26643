"""Teacher fidelity on tiny random models, and the held-out perplexity task's documents."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from swiftkv import convert_to_swiftkv
from swiftkv.data.conversations import Conversation
from swiftkv.data.heldout import heldout_sample, perplexity_docs, truncate_to_tokens, write_perplexity_task
from swiftkv.measure.fidelity import (
    FidelitySettings,
    common_prefix,
    greedy_continuations,
    measure_fidelity,
    teacher_forced,
)
from swiftkv.models.kvquant import make_cache_factory
from tests.conftest import tiny_base
from tests.test_evaluate import tiny_tokenizer, words  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def conversations(n: int = 6) -> list[Conversation]:
    return [Conversation(f"c{i}", [{"role": "user", "content": words(*range(2 + i, 12 + i))},
                                   {"role": "assistant", "content": words(*range(40 + i, 60 + i))}]) for i in range(n)]


@torch.no_grad()
def test_teacher_forced_kl_and_top1_match_a_direct_computation():
    teacher = tiny_base()
    student = convert_to_swiftkv(tiny_base(), 2)
    seqs = [list(range(2, 20)), list(range(30, 42))]
    rows = teacher_forced(teacher, student, seqs, batch_size=2, progress=False)
    for seq, row in zip(seqs, rows):
        ids = torch.tensor([seq])
        t = F.log_softmax(teacher(ids).logits[0], -1)
        s = F.log_softmax(student(ids).logits[0], -1)
        assert row["tokens"] == len(seq)
        assert row["kl_sum"] == pytest.approx(float((t.exp() * (t - s)).sum()), rel=1e-4)
        assert row["top1_agree"] == float((t.argmax(-1) == s.argmax(-1)).sum())
        assert row["kl_sum"] > 0


@torch.no_grad()
def test_a_model_is_perfectly_faithful_to_itself_and_fp8_is_not():
    model, tok = tiny_base(), tiny_tokenizer()
    settings = FidelitySettings(num_sequences=3, max_tokens=24, num_prompts=3, max_prompt_tokens=40, new_tokens=5,
                                batch_size=2)
    same = measure_fidelity(model, model, tok, conversations(), settings, progress=False)
    assert same["kl"] == 0 and same["top1"] == 1 and same["greedy"] == 1
    fp8 = measure_fidelity(model, model, tok, conversations(), settings, make_cache_factory("fp8"), progress=False)
    assert fp8["kl"] > 0 and len(fp8["greedy_rows"]) == 3


@torch.no_grad()
def test_greedy_student_matches_its_own_full_decoding():
    student = convert_to_swiftkv(tiny_base(), 2)
    prompts = [list(range(2, 9)), list(range(20, 24))]
    out = greedy_continuations(student, prompts, new_tokens=6, pad_id=0, eos_id=None, batch_size=2, progress=False)
    for prompt, cont in zip(prompts, out):
        ids = torch.tensor([prompt])
        student.model.prefill_skip = False
        for _ in range(6):
            ids = torch.cat([ids, student(ids, use_cache=False).logits[:, -1:].argmax(-1)], 1)
        student.model.prefill_skip = True
        assert cont == ids[0, len(prompt):].tolist()
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2


def test_perplexity_documents_are_cut_at_token_boundaries(tmp_path):
    tok = tiny_tokenizer()
    text, n = truncate_to_tokens(tok, words(*range(2, 30)), 10)
    assert n == 10 and tok(text, add_special_tokens=False)["input_ids"] == list(range(2, 12))
    docs = perplexity_docs(tok, conversations(), num_docs=4, max_tokens=20, min_tokens=8)
    assert len(docs) == 4 and all(d["tokens"] == 20 for d in docs)
    path = write_perplexity_task(docs, tmp_path)
    from lm_eval.tasks import TaskManager

    task = TaskManager(include_path=[str(tmp_path)], include_defaults=False).load([path.stem])["tasks"][path.stem]
    assert task.OUTPUT_TYPE == "loglikelihood_rolling" and len(list(task.eval_docs)) == 4


def test_heldout_sample_order_does_not_depend_on_input_order():
    convs = conversations(6)
    assert [c.id for c in heldout_sample(convs)] == [c.id for c in heldout_sample(convs[::-1])]


def test_conversations_round_trip(tmp_path):
    from swiftkv.data.heldout import read_conversations, write_conversations

    convs = conversations(3)
    write_conversations(convs, tmp_path / "c.jsonl")
    back = read_conversations(tmp_path / "c.jsonl")
    assert [(c.id, c.messages) for c in back] == [(c.id, c.messages) for c in convs]


@torch.no_grad()
def test_the_teacher_computed_once_gives_the_same_numbers(family, tmp_path):
    """``teacher_outputs`` saved and loaded, then ``measure_fidelity(..., cached=)`` runs only the teacher's head: every
    number equals the run that computes the teacher itself, for a student, the teacher itself and its FP8 cache."""
    from swiftkv.measure.fidelity_teacher import TeacherOutputs, teacher_outputs

    teacher, tok = tiny_base(family), tiny_tokenizer()
    student = convert_to_swiftkv(tiny_base(family), 2)
    settings = FidelitySettings(num_sequences=5, max_tokens=24, num_prompts=3, max_prompt_tokens=40, new_tokens=5,
                                batch_size=2)
    teacher_outputs(teacher, tok, conversations(), settings, progress=False).save(tmp_path / "ft")
    cached = TeacherOutputs.load(tmp_path / "ft")
    assert len(cached.hidden) == 3 and len(cached.greedy) == 3  # batches of 2, 2, 1
    for model, factory in ((student, None), (teacher, None), (teacher, make_cache_factory("fp8"))):
        direct = measure_fidelity(teacher, model, tok, conversations(), settings, factory, progress=False)
        again = measure_fidelity(teacher, model, tok, conversations(), settings, factory, progress=False,
                                 cached=cached)
        assert again == direct
    assert direct["kl"] > 0  # the FP8 case: the teacher's side is really compared


@pytest.mark.parametrize("cut,group", [(2, 1), (1, 3)])
@torch.no_grad()
def test_a_student_takes_the_teachers_boundary_states(family, cut, group, tmp_path, caplog):
    """``teacher_outputs(..., boundary_layers=)`` keeps the stream entering each cut; a student at a kept cut whose
    layers < l are the teacher's takes it (its layers < l never run teacher-forced) and every number equals its own
    run; with the FP8 cache it runs them itself, and with layers < l of another base model too, saying why."""
    from swiftkv.errors import SwiftKVError
    from swiftkv.measure.fidelity import teacher_forced
    from swiftkv.measure.fidelity_teacher import TeacherOutputs, teacher_outputs

    teacher, tok = tiny_base(family), tiny_tokenizer()
    settings = FidelitySettings(num_sequences=5, max_tokens=24, num_prompts=3, max_prompt_tokens=40, new_tokens=5,
                                batch_size=2)
    teacher_outputs(teacher, tok, conversations(), settings, progress=False,
                    boundary_layers=[1, 2]).save(tmp_path / "ft")
    cached = TeacherOutputs.load(tmp_path / "ft")
    assert sorted(cached.boundary) == [1, 2] and [len(b) for b in cached.boundary.values()] == [3, 3]
    student = convert_to_swiftkv(tiny_base(family), cut, group)
    direct = measure_fidelity(teacher, student, tok, conversations(), settings, progress=False)
    given = measure_fidelity(teacher, student, tok, conversations(), settings, progress=False, cached=cached)
    assert direct["boundary_layer"] is None and given["boundary_layer"] == cut
    assert given["greedy_rows"] == direct["greedy_rows"]
    for key in ("kl_sum", "top1_agree", "tokens"):
        assert [r[key] for r in given["teacher_forced"]] == pytest.approx([r[key] for r in direct["teacher_forced"]],
                                                                         rel=1e-5, abs=1e-6)
    assert direct["kl"] > 0  # an untrained student: the comparison is not between equal models
    seqs = [[3 + i, 9, 14, 7 + i, 30, 2] for i in range(5)]
    ran = []
    hooks = [layer.register_forward_hook(lambda *a: ran.append(1)) for layer in student.model.layers[:cut]]
    try:
        teacher_forced(teacher, student, seqs[:2], 2, progress=False,
                       student_boundary=[teacher_outputs_stream(teacher, seqs[:2], cut)])
    finally:
        for hook in hooks:
            hook.remove()
    assert not ran  # teacher-forced, the student's layers < l never ran
    with caplog.at_level("WARNING"):
        fp8 = measure_fidelity(teacher, student, tok, conversations(), settings, make_cache_factory("fp8"),
                               progress=False, cached=cached)
        other = convert_to_swiftkv(tiny_base(family, seed=7), cut, group)
        elsewhere = measure_fidelity(teacher, other, tok, conversations(), settings, progress=False, cached=cached)
    assert fp8["boundary_layer"] is None and elsewhere["boundary_layer"] is None
    assert caplog.text.count("runs its layers < l itself") == 1 and f"layers < {cut} (or their dtype)" in caplog.text
    assert cached.boundary_for(student, make_cache_factory("fp8"))[0] is None
    assert measure_fidelity(teacher, teacher, tok, conversations(), settings, progress=False,
                            cached=cached)["boundary_layer"] is None
    with pytest.raises(SwiftKVError, match="not cuts of a"):
        teacher_outputs(teacher, tok, conversations(), settings, progress=False, boundary_layers=[0])


def teacher_outputs_stream(teacher, seqs, cut):
    """The stream entering layer ``cut`` of ``teacher`` on the right-padded batch ``seqs`` (a forward hook)."""
    from swiftkv.measure.fidelity import _pad

    kept = []
    hook = teacher.get_decoder().layers[cut].register_forward_pre_hook(
        lambda m, args, kwargs: kept.append(args[0] if args else kwargs["hidden_states"]), with_kwargs=True)
    try:
        ids, mask = _pad(seqs, 0, "right")
        teacher.get_decoder()(input_ids=ids, attention_mask=mask, use_cache=False)
    finally:
        hook.remove()
    return kept[0]


@torch.no_grad()
def test_a_fidelity_teacher_for_other_settings_weights_or_sequences_is_refused(tmp_path):
    from swiftkv.errors import SwiftKVError
    from swiftkv.measure.fidelity_teacher import TeacherOutputs, teacher_outputs

    teacher, tok = tiny_base(), tiny_tokenizer()
    settings = FidelitySettings(num_sequences=3, max_tokens=24, num_prompts=2, max_prompt_tokens=40, new_tokens=4,
                                batch_size=2)
    teacher_outputs(teacher, tok, conversations(), settings, progress=False).save(tmp_path / "ft")
    cached = TeacherOutputs.load(tmp_path / "ft")
    cases = [
        (tiny_base(), conversations(), FidelitySettings(**{**settings.__dict__, "new_tokens": 5}),
         "other settings (new_tokens 5 != 4)"),
        (tiny_base(seed=7), conversations(), settings, "other teacher weights"),
        (tiny_base(), conversations()[1:], settings, "other teacher-forced sequences"),
    ]
    for model, convs, s, message in cases:
        with pytest.raises(SwiftKVError, match=message.replace("(", r"\(").replace(")", r"\)")):
            measure_fidelity(model, model, tok, convs, s, progress=False, cached=cached)
    (tmp_path / "ft" / "hidden.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(SwiftKVError, match="unreadable fidelity teacher"):
        TeacherOutputs.load(tmp_path / "ft")
    with pytest.raises(SwiftKVError, match="is not a fidelity teacher"):
        TeacherOutputs.load(tmp_path)
