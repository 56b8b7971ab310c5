"""GPU requests as ``--gpus`` gives them: parsing, rejecting, writing them back and saying
them in words; commands as people read them."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from agents import protocol
from agents.protocol import GpuRequest

AUTO = GpuRequest(count=1, auto=True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, AUTO),
        ("auto", AUTO),
        ("none", GpuRequest()),
        # GPU indices mean what CUDA_VISIBLE_DEVICES means: "0" is GPU 0, "1" is GPU 1.
        ("0", GpuRequest(count=1, indices=(0,))),
        ("1", GpuRequest(count=1, indices=(1,))),
        ("1,", GpuRequest(count=1, indices=(1,))),
        ("3,", GpuRequest(count=1, indices=(3,))),
        ("0,1", GpuRequest(count=2, indices=(0, 1))),
        ("3,1", GpuRequest(count=2, indices=(1, 3))),
        (" 0, 2 ", GpuRequest(count=2, indices=(0, 2))),
        ("any", GpuRequest(count=1)),
        ("any:2", GpuRequest(count=2)),
        ("ANY:3", GpuRequest(count=3)),
        ("all", GpuRequest(count=-1)),
    ],
)
def test_parse_gpus(text, expected):
    assert protocol.parse_gpus(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "--gpus none"),
        ("-1", "--gpus none"),
        ("any:0", "--gpus none"),
        ("any:x", "any:N"),
        (",", "--gpus any:2"),
        ("a", "--gpus any:2"),
        ("1,,2", "--gpus 0,1"),
        ("1.5", "--gpus 0,1"),
        ("gpu0", "CUDA_VISIBLE_DEVICES"),
        ("GPU-5d2c", "--gpus all"),
        ("0,0", "names a GPU twice"),
    ],
)
def test_parse_gpus_rejects_and_shows_the_forms(text, says):
    with pytest.raises(protocol.JobRequestError) as err:
        protocol.parse_gpus(text)
    assert says in str(err.value)


def test_gpu_request_text_round_trips():
    for text in ("auto", "none", "all", "any:2", "0", "3", "0,1"):
        request = protocol.parse_gpus(text)
        assert request.text == text
        assert protocol.parse_gpus(request.text) == request
    assert GpuRequest().text == "none"
    assert protocol.parse_gpus(None).text == "auto"


@pytest.mark.parametrize(
    ("stored", "words"),
    [
        (None, "no GPU (CPU only)"),
        ("none", "no GPU (CPU only)"),
        ("auto", "one free GPU"),
        ("any:1", "one free GPU"),
        ("any:2", "any 2 free GPUs"),
        ("all", "all GPUs"),
        ("0", "GPU 0"),
        ("3,", "GPU 3"),
        ("0,1", "GPUs 0, 1"),
    ],
)
def test_gpus_phrase(stored, words):
    assert protocol.gpus_phrase(stored) == words


def test_assigned_phrase_names_cuda_visible_devices():
    assert protocol.assigned_phrase((0,)) == "GPU 0 (CUDA_VISIBLE_DEVICES=0)"
    assert protocol.assigned_phrase((0, 1)) == "GPUs 0, 1 (CUDA_VISIBLE_DEVICES=0,1)"
    assert protocol.assigned_phrase(()) == "no GPU (CPU only)"


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["python", "train.py", "--lr", "3e-4"], "python train.py --lr 3e-4"),
        (["python", "-c", "print('hi')"], """python -c "print('hi')\""""),
        (["bash", "-c", "make data && python eval.py"], "bash -c 'make data && python eval.py'"),
        (["echo", "it's", 'say "hi"'], """echo "it's" 'say "hi"'"""),
        (["echo", """it's "$HOME" `x` \\"""], """echo "it's \\"\\$HOME\\" \\`x\\` \\\\\""""),
        (["torchrun", "--nproc_per_node=2", "a,b", "x:y", "ünïcødé"], None),
        (["echo", "", "two  spaces", "*"], "echo '' 'two  spaces' '*'"),
        (["printf", "line1\nline2"], "printf $'line1\\nline2'"),
    ],
)
def test_show_command_quotes_only_where_needed(argv, shown):
    text = protocol.show_command(argv)
    assert text == (shown if shown is not None else " ".join(argv))
    bash = shutil.which("bash")
    if bash is not None:  # bash reads it back to the same argv
        done = subprocess.run(
            [bash, "-c", f"printf '%s\\0' {text}"], capture_output=True, text=True, check=True
        )
        assert done.stdout.split("\0")[:-1] == argv
