"""--seq-len too short for a prompt and its answer is refused before Ray starts, after the data
was tokenized: the refused run leaves nothing behind."""

from __future__ import annotations

from training.driver import cli


def test_a_seq_len_that_cannot_hold_a_prompt_and_an_answer_is_refused(tmp_path, capsys):
    code = cli.main(["--demo", "--seq-len", "7", "--storage-path", str(tmp_path / "runs" / "a")])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_INPUT
    # The byte chat format: "<|user|>\n?\n<|assistant|>\n!" and the end of text, 27 tokens.
    assert "--seq-len 7 cannot hold a prompt and an answer: the shortest messages row is 27 " \
        "tokens with tokenizer 'bytes'; use --seq-len 27 or more" in err
    assert not (tmp_path / "runs").exists()  # no run.json, no token cache, no storage path
