"""Which generated tokens' text is out (launcher/python_backend/settle.py), on the tiny model's real byte-level
tokenizer: the ids Settle gives back at each step are exactly those whose text a detokenizer that holds back a
character's first bytes (vLLM's rule: the decoded text must not end in U+FFFD) has released."""

import pytest

from launcher.python_backend.settle import REPLACEMENT, Settle

pytestmark = pytest.mark.unit

TEXT = "naïve café: 日本語のテキスト 🙂🚀 ok — ∑ done"


def released(tok, ids):
    """The longest prefix of ids whose text a detokenizer has released: decode(ids[:j]) does not end in U+FFFD."""
    for j in range(len(ids), -1, -1):
        if not tok.decode(ids[:j], skip_special_tokens=True).endswith(REPLACEMENT):
            return j
    return 0


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_the_ids_settled_are_those_whose_text_is_out(tiny_model_dir, chunk):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok.encode(TEXT, add_special_tokens=False)
    settle, got, held = Settle(tok, {}), [], 0
    for at in range(0, len(ids), chunk):  # the engine gives `chunk` new tokens a step (outputs merged under load)
        got += settle.feed(ids[at : at + chunk])
        upto = min(at + chunk, len(ids))
        assert got == ids[: released(tok, ids[:upto])], (at, got)
        held += bool(settle.waiting)
    assert got == ids and tok.decode(got) == TEXT
    assert held, "no character of TEXT was split over tokens: the test checks nothing held back"
