"""Hypothesis strategies of what a connected machine may send on ``ballast.host.v1``
(PROTOCOL.md §2, docs/protocol-notes.md): a program of actions, each a frame of a
random or known type with random, missing or extra fields, sizes and encodings
(lone surrogates, NUL, NaN, huge numbers and texts, binary frames, text past
256 KiB, JSON that is not an object, nested past the recursion limit), in any
order, naming its own attempts, another machine's, or none.

A frame is a template: ``Ref`` values in it are filled in when it is sent
(``tests.fuzz.host_run``), with what only the run knows (the attempt offered to
this machine, the one the other machine is streaming, a receipt signed over the
text sent).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from tests.hostsim import MODEL
from trust.consumers import MachineConsumer

MAX_FRAME_BYTES = 256 * 1024  # hosts.consumers.MAX_FRAME_BYTES


@dataclass(frozen=True)
class Ref:
    """A value known only when the frame is sent: ``own`` (the attempt last
    offered to the fuzzing machine, else a fresh id), ``other`` (the attempt the
    honest machine is streaming), ``receipt`` (a signature of the fuzzing
    machine's key over what it sent for its own attempt)."""

    name: str


OWN, OTHER, RECEIPT = Ref("own"), Ref("other"), Ref("receipt")


@dataclass(frozen=True)
class Frame:
    """A JSON frame (a template with ``Ref`` values); ``dumps`` may write NaN."""

    template: object


@dataclass(frozen=True)
class Raw:
    """A websocket message sent as it is: ``text`` (a str, lone surrogates
    allowed) or ``binary`` (bytes)."""

    text: str | None = None
    binary: bytes | None = None


@dataclass(frozen=True)
class Hello:
    """A ``hello`` of the fuzzing machine: ``proof`` is ``valid``, ``none``,
    ``wrong`` (another nonce signed), ``stranger`` (a valid proof by a key
    that is not the pinned one) or ``honest`` (the honest machine's key and
    proof); ``fields`` replace its fields (devices, engine…)."""

    proof: str = "valid"
    fields: tuple = ()


@dataclass(frozen=True)
class RenterRequest:
    """Start a renter's request that only the fuzzing machine can take (its
    region), so the machine gets offers of its own (once per program)."""


# --- values --------------------------------------------------------------------------
surrogates = st.text(
    alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1
)
texts = st.one_of(
    st.text(max_size=40),
    st.text(max_size=5) | surrogates,
    st.just("\x00"),
    st.integers(65_530, 65_540).map(lambda n: "x" * n),  # the token bound
    st.just(MODEL),
)
numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(-2, 70),
    st.floats(allow_nan=True, allow_infinity=True),
)
json_values = st.recursive(
    st.none() | st.booleans() | numbers | texts,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
job_refs = st.one_of(st.just(OWN), st.just(OTHER), st.uuids().map(str), json_values)


def _mutated(frames: st.SearchStrategy) -> st.SearchStrategy:
    """A frame of ``frames`` as it is, or with a field dropped, replaced or added."""

    @st.composite
    def mutated(draw):
        frame = dict(draw(frames))
        how = draw(st.sampled_from(["keep", "drop", "replace", "add"]))
        keys = [k for k in frame if k != "type"]
        if how == "drop" and keys:
            frame.pop(draw(st.sampled_from(keys)))
        elif how == "replace" and keys:
            frame[draw(st.sampled_from(keys))] = draw(json_values)
        elif how == "add":
            frame[draw(st.text(max_size=8))] = draw(json_values)
        return frame

    return mutated()


def _device_reports():
    return st.fixed_dictionaries(
        {
            "index": st.integers(0, 2) | numbers,
            "temp_c": st.floats(30, 90) | numbers | st.none(),
            "vram_free_mb": st.integers(0, 24_000) | numbers,
            "loaded_models": st.lists(st.just(MODEL) | texts, max_size=3) | json_values,
            "slots": st.integers(0, 4) | numbers,
        }
    )


HEARTBEAT_VALID = {
    "type": "heartbeat",
    "paused": False,
    "devices": [
        {
            "index": 0,
            "temp_c": 50.0,
            "vram_free_mb": 8000,
            "loaded_models": [MODEL],
            "slots": 1,
        }
    ],
}

heartbeats = st.just(HEARTBEAT_VALID) | _mutated(
    st.fixed_dictionaries(
        {
            "type": st.just("heartbeat"),
            "paused": st.booleans() | json_values,
            "devices": st.lists(_device_reports(), max_size=17),
        }
    )
)
reports = _mutated(
    st.fixed_dictionaries(
        {
            "type": st.just("benchmark"),
            "device": st.integers(0, 2) | numbers,
            "model": st.just(MODEL) | texts,
            "tokens_per_s": numbers,
            "ttft_ms": numbers,
            "vram_used_mb": numbers | st.none(),
        }
    )
) | _mutated(
    st.fixed_dictionaries(
        {
            "type": st.just("model_load_failed"),
            "device": st.integers(0, 2) | numbers,
            "model": st.just(MODEL) | texts,
            "error": texts,
        }
    )
)
usages = st.fixed_dictionaries(
    {
        "prompt_tokens": st.integers(0, 20) | numbers,
        "completion_tokens": st.integers(0, 20) | numbers,
    }
)
job_frames = st.one_of(
    _mutated(st.fixed_dictionaries({"type": st.just("claim"), "job": job_refs})),
    _mutated(
        st.fixed_dictionaries(
            {"type": st.just("token"), "job": job_refs, "text": texts}
        )
    ),
    _mutated(
        st.fixed_dictionaries(
            {
                "type": st.just("done"),
                "job": job_refs,
                "finish_reason": st.sampled_from(["stop", "length"]) | json_values,
                "usage": usages | json_values,
                "receipt": st.just(RECEIPT) | texts,
            }
        )
    ),
    _mutated(
        st.fixed_dictionaries(
            {"type": st.just("error"), "job": job_refs, "message": texts}
        )
    ),
    _mutated(
        st.fixed_dictionaries(
            {
                "type": st.just("cancelled"),
                "job": job_refs,
                "usage": usages | json_values,
                "receipt": st.just(RECEIPT) | texts,
            }
        )
    ),
)
hellos = st.builds(
    Hello,
    proof=st.sampled_from(
        ["valid", "valid", "valid", "none", "wrong", "stranger", "honest"]
    ),
    fields=st.one_of(
        st.just(()),
        st.tuples(
            st.tuples(
                st.just("devices"),
                st.lists(
                    st.fixed_dictionaries(
                        {
                            "index": st.integers(0, 17) | numbers,
                            "name": texts,
                            "vram_total_mb": st.integers(0, 2**31) | numbers,
                        }
                    ),
                    max_size=17,
                )
                | json_values,
            )
        ),
        st.tuples(
            st.tuples(
                st.sampled_from(
                    ["agent_version", "engine", "public_key", "accepts_serverless"]
                ),
                json_values,
            )
        ),
    ),
)
raws = st.one_of(
    st.binary(max_size=64).map(lambda b: Raw(binary=b)),
    st.text(max_size=30).map(lambda t: Raw(text=t)),  # mostly not JSON
    json_values.filter(lambda v: not isinstance(v, dict)).map(
        lambda v: Frame(v)  # JSON, but not an object
    ),
    st.integers(MAX_FRAME_BYTES - 40, MAX_FRAME_BYTES + 40).map(
        lambda n: Raw(text='{"type": "heartbeat", "pad": "' + "x" * n + '"}')
    ),
    st.integers(MAX_FRAME_BYTES // 2 - 20, MAX_FRAME_BYTES // 2 + 20).map(
        lambda n: Raw(text='{"type": "heartbeat", "pad": "' + "é" * n + '"}')
    ),
    st.just(Raw(text="[" * 100_000 + "]" * 100_000)),
    st.dictionaries(st.text(max_size=6), json_values, max_size=3).map(Frame),
    st.text(max_size=12).map(lambda kind: Frame({"type": kind})),
    # the names of the consumer's own methods, with and without the prefix of
    # its frame handlers: only the protocol's frame types may reach one
    st.sampled_from(
        sorted({n.removeprefix("frame_") for n in dir(MachineConsumer)})
    ).map(lambda kind: Frame({"type": kind})),
)
actions = st.one_of(
    job_frames.map(Frame),
    heartbeats.map(Frame),
    reports.map(Frame),
    hellos,
    raws,
    st.just(RenterRequest()),
)
# frames of the fuzzing machine's own attempt, well formed or not, in any order
own_frames = st.one_of(
    st.just({"type": "claim", "job": OWN}),
    st.builds(lambda t: {"type": "token", "job": OWN, "text": t}, texts),
    st.builds(
        lambda n, r: {
            "type": "done",
            "job": OWN,
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 3, "completion_tokens": n},
            "receipt": r,
        },
        st.integers(0, 30),
        st.just(RECEIPT) | texts,
    ),
    st.builds(
        lambda n: {
            "type": "cancelled",
            "job": OWN,
            "usage": {"prompt_tokens": 3, "completion_tokens": n},
            "receipt": RECEIPT,
        },
        st.integers(0, 30),
    ),
    st.builds(lambda m: {"type": "error", "job": OWN, "message": m}, texts),
    job_frames,
).map(Frame)
# a machine that says hello, is live and is offered a request of its own
LIVELY = [Hello(), Frame(HEARTBEAT_VALID), RenterRequest()]
# a program: usually a hello first (most frames need one), then actions
programs = st.one_of(
    st.tuples(
        st.one_of(st.just(Hello()), st.just(Hello()), hellos, st.none()),
        st.lists(actions, max_size=12),
    ).map(lambda p: ([p[0]] if p[0] is not None else []) + p[1]),
    st.tuples(st.lists(own_frames, max_size=8), st.lists(actions, max_size=4)).map(
        lambda p: LIVELY + p[0] + p[1]
    ),
)
