"""Two model families and two precisions on real processes (issue 31 item 5).

The catalog gets a second family by ``catalog_add`` (``tests/models/build.py``'s
tiny Llama 3: Llama 3's real tokenizer and chat template, a context of 512)
beside SmolLM2 (Q4_1). Real agents serve both side by side in llama.cpp; each
model's requests are counted, refused past its context and billed by its own
tokenizer (checked against llama.cpp's tokenizer of the model's file). SmolLM2
requantized to Q4_0 by llama.cpp is never offered the Q4_1 entry's jobs when its
host says what it runs; a host that declares the Q4_1 digest while running the
Q4_0 file is served (what it declares is all the coordinator sees: catching it
is the spot checks' and verification's work, docs/trust.md).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import httpx
import llama_cpp
import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from ballast.stack import manage
from modeldata.reference import smollm2_gguf_path
from tests.modeldata.vectors import VectorsUnavailable
from tests.models.build import smollm2_q4_0, tiny_llama3

from .env import children_rows

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-llama3"

pytestmark = pytest.mark.e2e


@pytest.fixture
def e2e_env(e2e_env):
    # a few hundred tokens of prompt: on a shared, loaded CI machine their
    # prefill alone can pass the 20 s default
    e2e_env["BALLAST_CLAIM_TIMEOUT_S"] = "60"
    e2e_env["BALLAST_FIRST_TOKEN_TIMEOUT_S"] = "120"
    e2e_env["BALLAST_STALL_TIMEOUT_S"] = "120"
    return e2e_env


@pytest.fixture(scope="module")
def tiny_file() -> Path:
    try:
        return tiny_llama3()
    except VectorsUnavailable as exc:
        pytest.skip(f"llama.cpp's vocabulary files cannot be downloaded: {exc}")


@pytest.fixture(scope="module")
def q4_0_file() -> Path:
    return smollm2_q4_0()


def vocab_of(path: Path) -> llama_cpp.Llama:
    """llama.cpp's tokenizer of a model file (its vocabulary only)."""
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def tokens(llama: llama_cpp.Llama, text: str, *, special: bool) -> list[int]:
    return llama.tokenize(text.encode(), add_bos=False, special=special)


def rendered_tokens(llama: llama_cpp.Llama, messages: list[dict]) -> int:
    """Tokens of the chat prompt as llama.cpp renders it with the file's own
    template (BOS once: the template prints it or it is added)."""
    bos = llama.detokenize([llama.token_bos()], special=True).decode()
    eos = llama.detokenize([llama.token_eos()], special=True).decode()
    formatter = Jinja2ChatFormatter(
        llama.metadata["tokenizer.chat_template"], eos_token=eos, bos_token=bos
    )
    ids = tokens(llama, formatter(messages=messages).prompt, special=True)
    return len(ids) + (0 if ids[:1] == [llama.token_bos()] else 1)


def declared(env, machine: str) -> tuple[str, str] | None:
    rows = children_rows(
        env,
        "SELECT dm.weights_sha256, dm.weights_quantization FROM hosts_devicemodel dm"
        " JOIN hosts_device d ON d.id = dm.device_id"
        " JOIN hosts_machine m ON m.id = d.machine_id"
        f" WHERE m.name = '{machine}' AND dm.loaded AND dm.weights_sha256 <> ''",
    )
    return tuple(rows[0]) if rows else None


def jobs_of(env, model: str) -> int:
    return children_rows(
        env, f"SELECT COUNT(*) FROM jobs_job WHERE model_id = '{model}'"
    )[0][0]


def chat(stack, key: str, model: str, messages: list[dict], **params) -> httpx.Response:
    return httpx.post(
        f"{stack.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "messages": messages, "temperature": 0, **params},
        timeout=180,
    )


def job_of(stack, key: str, answer: httpx.Response) -> dict:
    return httpx.get(
        f"{stack.url}/v1/jobs/{answer.headers['x-ballast-job-id']}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ).json()


def test_each_family_is_counted_refused_and_billed_by_its_own_tokenizer(
    stack, renter_key, machine, tiny_file
):
    added = manage(
        "catalog_add", str(tiny_file), "--id", TINY,
        "--price-in", "0.1", "--price-out", "1000",
        env=stack.env,
    )  # fmt: skip
    digest = hashlib.sha256(tiny_file.read_bytes()).hexdigest()
    assert f"weights sha256 {digest}" in added
    stack.start_agent("agent-smollm2", machine("rig-smollm2"))
    stack.start_agent(
        "agent-tiny", machine("rig-tiny"),
        "--model", TINY, "--model-path", str(tiny_file),
    )  # fmt: skip
    stack.wait_for_capacity(renter_key, SMOLLM2, timeout_s=180)
    stack.wait_for_capacity(renter_key, TINY, timeout_s=180)
    assert declared(stack.env, "rig-tiny") == (digest, "F16")

    tiny, smol = vocab_of(tiny_file), vocab_of(smollm2_gguf_path())
    messages = [{"role": "user", "content": "What is 2+2? Answer in one word."}]
    prompt_tiny = rendered_tokens(tiny, messages)
    assert prompt_tiny != rendered_tokens(smol, messages), "the families count apart"

    for model, rig, vocab, prompt in (
        (TINY, "rig-tiny", tiny, prompt_tiny),
        (SMOLLM2, "rig-smollm2", smol, rendered_tokens(smol, messages)),
    ):
        answers = [
            chat(stack, renter_key, model, messages, max_tokens=12) for _ in "ab"
        ]
        for answer in answers:
            assert answer.status_code == 200, answer.text
        body = answers[0].json()
        text = body["choices"][0]["message"]["content"]
        assert answers[1].json()["choices"][0]["message"]["content"] == text, (
            f"{model} at temperature 0 answers the same"
        )
        assert body["usage"]["prompt_tokens"] == prompt, model
        recount = len(tokens(vocab, text, special=False))
        billed = body["usage"]["completion_tokens"]
        assert 0 < billed <= min(12, recount), (model, text, billed, recount)
        job = job_of(stack, renter_key, answers[0])
        assert [a["device"].split("/")[0] for a in job["attempts"]] == [rig]
        assert job["tokens_billed"] == billed
        if model == TINY:  # 1000 USD per million tokens out: a milli-USD a token
            assert float(job["cost"]) == pytest.approx(billed / 1000)
            tiny_text, tiny_billed = text, billed
    # the tiny model's answer counted by SmolLM2's vocabulary is another count
    assert len(tokens(smol, tiny_text, special=False)) != tiny_billed

    # refused past its own context (512), before any job exists; SmolLM2 (2048)
    # takes the same prompt
    before = jobs_of(stack.env, TINY)
    refused = chat(stack, renter_key, TINY, messages, max_tokens=512 - prompt_tiny + 1)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["message"] == (
        f"the prompt ({prompt_tiny} tokens) plus max_tokens={512 - prompt_tiny + 1}"
        " exceed the model's context of 512 tokens"
    )
    fits = chat(stack, renter_key, TINY, messages, max_tokens=512 - prompt_tiny)
    assert fits.status_code == 200, fits.text
    words = "one two three four five " * 120
    question = f"Count the words: {words}\nWhat is the last word?"
    long = [{"role": "user", "content": question}]
    assert 512 < rendered_tokens(tiny, long) and rendered_tokens(smol, long) < 2000
    refused = chat(stack, renter_key, TINY, long, max_tokens=4)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert jobs_of(stack.env, TINY) == before + 1, "only the request that fits ran"
    taken = chat(stack, renter_key, SMOLLM2, long, max_tokens=4)
    assert taken.status_code == 200, taken.text
    assert taken.json()["usage"]["prompt_tokens"] == rendered_tokens(smol, long)


def lying_cache(folder: Path, served: Path, declared_as: Path) -> Path:
    """An agent's weights cache (``agent.weights``) that says ``served`` holds
    ``declared_as``'s weights: what a host who read the code writes to declare
    the catalog's digest while running other weights."""
    stat = served.resolve().stat()
    cache = folder / "ballast-agent" / "weights.json"
    cache.parent.mkdir(parents=True)
    entry = {
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": hashlib.sha256(declared_as.read_bytes()).hexdigest(),
        "quantization": "Q4_1",
    }
    cache.write_text(
        json.dumps({"format": 1, "files": {str(served.resolve()): entry}})
    )
    return folder


def agent_start(stack, name: str, token: str, *extra: str, cache_home: Path) -> None:
    """``stack.start_agent`` with a cache folder of its own (XDG_CACHE_HOME)."""
    stack.spawn(
        name,
        [sys.executable, "-m", "agent", "run", "--server", stack.url]
        + ["--key-file", str(stack.log_dir / f"{name}-key.pem"), *extra],
        env={"BALLAST_MACHINE_TOKEN": token, "XDG_CACHE_HOME": str(cache_home)},
    )


def test_q4_0_under_the_q4_1_entry(stack, renter_key, machine, q4_0_file, tmp_path):
    pinned = hashlib.sha256(smollm2_gguf_path().read_bytes()).hexdigest()
    messages = [{"role": "user", "content": "What is 2+2?"}]
    agent_start(
        stack, "agent-q4-0", machine("rig-q4-0"), "--model-path", str(q4_0_file),
        cache_home=tmp_path / "honest-cache",
    )  # fmt: skip
    stack.wait_for(
        lambda: declared(stack.env, "rig-q4-0"), "the Q4_0 weights declared", 180
    )
    sha, quantization = declared(stack.env, "rig-q4-0")
    assert quantization == "Q4_0" and sha != pinned
    refused = chat(stack, renter_key, SMOLLM2, messages, max_tokens=8)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["message"] == (
        f"no live device runs the catalog's weights of model '{SMOLLM2}'"
        f" (Q4_1 {pinned[:12]}…)"
    )

    # the same file, its host declaring the catalog's digest: served
    agent_start(
        stack, "agent-liar", machine("rig-liar"), "--model-path", str(q4_0_file),
        cache_home=lying_cache(tmp_path / "liar-cache", q4_0_file, smollm2_gguf_path()),
    )  # fmt: skip
    stack.wait_for(
        lambda: declared(stack.env, "rig-liar"), "the liar's weights declared", 180
    )
    assert declared(stack.env, "rig-liar") == (pinned, "Q4_1")
    for _ in range(2):  # both live: every job goes to the one declaring Q4_1
        answer = chat(stack, renter_key, SMOLLM2, messages, max_tokens=8)
        assert answer.status_code == 200, answer.text
        attempts = job_of(stack, renter_key, answer)["attempts"]
        assert [a["device"].split("/")[0] for a in attempts] == ["rig-liar"]
