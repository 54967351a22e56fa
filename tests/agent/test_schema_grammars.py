"""Every schema the coordinator admits has a grammar the reference agent's
llama.cpp builds (DESIGN.md "Fair to honest hosts": a host that fails a job
because of what the renter asked is blamed for nothing, so what no engine can
do is refused at admission, ``jobs.schemas``).

Generated schemas, with what broke hosts before: text (double quotes,
backslashes, control characters, braces, NUL, lone surrogates, emoji) in
property names and ``enum``/``const`` literals, ``$ref`` as a property name
or a key inside a ``const``, recursive definitions named
as pydantic names them or like a grammar's own rules, ``items: {}``, ``$ref``
at the root or inside: each
one ``schema_checked`` admits is converted (``constrained.grammar_of``) and
parsed by llama.cpp against SmolLM2's vocabulary (``GrammarMask``).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.engines.constrained import GrammarMask, grammar_of
from jobs.errors import ApiError
from jobs.schemas import schema_checked

TRICKY = ['"', "\\", "\n", "\t", "}", "{", "\x00", "\ud800", "é", "😀", " ", "#", "|", "'"]
DEF_NAMES = ["Node", "my_node", "a.b", "Tree_Node", "Page_int_", "space", "string", "root"]
texts = st.text(
    alphabet=st.one_of(st.sampled_from(TRICKY), st.characters(codec="utf-8")),
    min_size=1,
    max_size=6,
)
names = st.one_of(st.just("$ref"), texts)
"""Property names and keys inside literals: ``$ref`` too (llama.cpp's
converter reads every ``$ref`` key as a reference)."""
leaves = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["integer", "number", "boolean"])}),
    st.fixed_dictionaries(
        {"type": st.just("string")},
        optional={"maxLength": st.integers(0, 8)},
    ),
    st.fixed_dictionaries({"enum": st.lists(st.one_of(texts, st.integers()), min_size=1, max_size=4)}),
    st.fixed_dictionaries({"const": st.one_of(texts, st.dictionaries(names, texts, max_size=2))}),
    st.sampled_from(DEF_NAMES).map(lambda name: {"$ref": f"#/$defs/{name}"}),
    st.sampled_from(DEF_NAMES).flatmap(  # inside a definition: a schema, or a map
        lambda name: st.sampled_from(
            [f"#/$defs/{name}/properties", f"#/$defs/{name}/properties/children"]
        ).map(lambda ref: {"$ref": ref})
    ),
    st.just({}),
)


def _objects(children: Any) -> Any:
    return st.dictionaries(names, children, min_size=1, max_size=3).flatmap(
        lambda props: st.fixed_dictionaries(
            {
                "type": st.just("object"),
                "properties": st.just(props),
                "required": st.lists(st.sampled_from(sorted(props)), unique=True),
            }
        )
    )


def _trees(children: Any) -> Any:
    return st.one_of(
        _objects(children),
        st.fixed_dictionaries({"type": st.just("array"), "items": children}),
        st.fixed_dictionaries({"anyOf": st.lists(children, min_size=1, max_size=3)}),
    )


def _node(name: str) -> dict:
    """A recursive definition (a tree) named ``name``."""
    return {
        "type": "object",
        "properties": {
            "children": {"type": "array", "items": {"$ref": f"#/$defs/{name}"}},
            "tags": {"type": "array", "items": {}},
        },
    }


schemas = st.recursive(leaves, _trees, max_leaves=6).map(
    lambda schema: {**schema, "$defs": {name: _node(name) for name in DEF_NAMES}}
)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schemas)
def _each_admitted_schema_builds(engine: Any, schema: dict) -> None:
    try:
        cleaned = schema_checked(schema, param="schema")
    except ApiError:
        return  # refused before dispatch: no host ever sees it
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "t", "schema": cleaned, "strict": True},
    }
    grammar = GrammarMask(engine._vocab, grammar_of(response_format), engine._llama.n_vocab())
    grammar.close()


def test_every_admitted_schema_has_a_grammar_llama_cpp_builds(llama_engine):
    _each_admitted_schema_builds(llama_engine)
