"""Fuzzing `POST /v2/models/smollm2-135m-instruct/infer` through the local stack, on the real model.

Bodies are arbitrary JSON values, arbitrary bytes, and token requests with every field mutated (huge
and negative numbers, NaN, Infinity, lone surrogates, wrong types, unknown fields, shapes that do not
match). No answer is a 5xx: a bad request is a 400 whose body is exactly `{"error": "<message>"}`, and
a request that passes is a 200 with token ids of the model. The model's registry entry caps prompts at
32 tokens and generation at 3 tokens (`max_input_tokens`, `max_iter_times`), so that the requests that
do run are quick. Derandomized: CI runs the same examples every time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.model, pytest.mark.timeout(300), DEFAULT.mark]

MODEL = "smollm2-135m-instruct"
VOCAB = 49152  # SmolLM2's vocabulary
MAX_PROMPT, MAX_NEW = 32, 3
FUZZ = settings(
    max_examples=100,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


@pytest.fixture(scope="module")
def http(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    registry = tmp_path_factory.mktemp("registry") / "models.yaml"
    registry.write_text(
        f"models:\n  {MODEL}:\n    backend: llama_cpp\n    n_ctx: 2048\n"
        f"    max_input_tokens: {MAX_PROMPT}\n    max_iter_times: {MAX_NEW}\n",
        encoding="utf-8",
    )
    environment = {"MODEL_REGISTRY": str(registry)}
    with (
        shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("fuzz"), environment) as shared,
        httpx.Client(
            base_url=shared.stack.base_url,
            headers={"Authorization": f"Bearer {shared.stack.api_key}"},
            timeout=120,
        ) as client,
    ):
        warm = client.post(f"/v2/models/{MODEL}/infer", json=token_body([1, 2, 3]))  # loads the model
        assert warm.status_code == 200, warm.text
        yield client


def token_body(ids: Any, **parameters: Any) -> dict[str, Any]:
    return {
        "inputs": [{"name": "input0", "shape": [1, len(ids)], "datatype": "UINT32", "data": ids}],
        "outputs": [{"name": "output0"}],
        "parameters": parameters,
    }


TEXT = st.text(st.characters(exclude_categories=()), max_size=8)  # lone surrogates and controls included
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)
INTS = st.one_of(
    st.integers(-2, 6),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**64 - 1, 2**64, 10**400]),
)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-3, 3),
    st.sampled_from([1e-6, 1e-7, 0.5, 1.0, 1.0000001, 2.0, 1e400]),
)
SOMETIMES = st.sampled_from([False, False, False, False, True])  # shrinks to False: no mutation


def mostly(valid: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid`, or one time in five `hostile`."""
    return SOMETIMES.flatmap(lambda mutate: hostile if mutate else valid)


PARAMETERS = st.fixed_dictionaries(
    {},
    optional={
        "temperature": mostly(st.floats(0.01, 2), st.one_of(NUMBERS, VALUES)),
        "top_k": mostly(st.integers(1, 100), st.one_of(INTS, VALUES)),
        "top_p": mostly(st.floats(0.01, 1), NUMBERS),
        "do_sample": mostly(st.booleans(), VALUES),
        "seed": mostly(st.integers(1, 2**64 - 1), st.one_of(INTS, st.none())),
        "repetition_penalty": mostly(st.floats(0.5, 2), NUMBERS),
        "max_new_tokens": mostly(st.integers(1, 2**31 - 1), st.one_of(INTS, VALUES)),
        "priority": mostly(st.integers(1, 5), INTS),
        "timeout": mostly(st.integers(10, 3600), INTS),
        "watermark": mostly(st.booleans(), VALUES),
        "details": VALUES,
        "batch_size": VALUES,
    },
)
TOKEN_IDS = st.lists(
    mostly(st.integers(0, VOCAB - 1), st.one_of(INTS, VALUES)), min_size=1, max_size=MAX_PROMPT + 2
)


@st.composite
def token_requests(draw: st.DrawFn) -> Any:
    """A token request, valid or with some of its fields replaced by hostile values."""
    body = token_body(draw(TOKEN_IDS), **draw(PARAMETERS))
    tensor = body["inputs"][0]
    for field, hostile in [
        ("shape", st.one_of(st.lists(st.integers(-2, MAX_PROMPT + 2), max_size=3), VALUES)),
        ("name", st.one_of(st.sampled_from(["input1", "", "x" * 257]), TEXT)),
        ("datatype", st.one_of(st.sampled_from(["UINT64", "INT32", "uint32"]), VALUES)),
        ("parameters", VALUES),
    ]:
        if draw(SOMETIMES) and draw(SOMETIMES):
            tensor[field] = draw(hostile)
    if draw(SOMETIMES):
        body["id"] = draw(
            mostly(
                st.from_regex(r"[A-Za-z0-9_-]{1,256}", fullmatch=True),
                st.one_of(st.sampled_from(["a" * 257, "bad id", ""]), TEXT, VALUES),
            )
        )
    if draw(SOMETIMES) and draw(SOMETIMES):
        body["outputs"] = draw(
            st.one_of(st.just([]), st.lists(st.fixed_dictionaries({"name": TEXT}), max_size=2), VALUES)
        )
    if draw(SOMETIMES) and draw(SOMETIMES):
        body["inputs"] = draw(st.one_of(st.just([]), st.just([tensor, tensor]), VALUES))
    if draw(SOMETIMES) and draw(SOMETIMES):
        body[draw(st.sampled_from(["model", "extra", ""]))] = draw(VALUES)
    if draw(SOMETIMES) and draw(SOMETIMES):
        body.pop(draw(st.sampled_from(["inputs", "outputs", "parameters"])))
    return body


def render(value: Any, ascii_only: bool) -> bytes:
    # NaN/Infinity literals and, with ascii_only False, lone surrogates written raw (invalid UTF-8).
    return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True).encode("utf-8", "surrogatepass")


CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json",
        "text/plain",
        "application/octet-stream",
        "multipart/form-data; boundary=x",
    ]
)


def check_answer(http: httpx.Client, content: bytes, content_type: str, sent: Any = None) -> None:
    response = http.post(f"/v2/models/{MODEL}/infer", content=content, headers={"Content-Type": content_type})
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    if response.status_code == 400:
        assert list(answer) == ["error"] and isinstance(answer["error"], str) and answer["error"], answer
        return
    assert response.status_code == 200, (response.status_code, answer, content[:300])
    assert isinstance(sent, dict), content[:300]  # only a request object can succeed
    [output] = answer["outputs"]
    ids = output["data"]
    assert output == {
        "name": sent["outputs"][0]["name"],
        "shape": [1, len(ids)],
        "datatype": "UINT32",
        "data": ids,
    }
    assert 1 <= len(ids) <= MAX_NEW and all(type(i) is int and 0 <= i < VOCAB for i in ids), ids
    assert answer["id"] == sent.get("id") or (sent.get("id") is None and answer["id"])


@FUZZ
@given(token_requests(), st.booleans())
def test_mutated_token_requests_are_answered_200_or_400(
    http: httpx.Client, body: Any, ascii_only: bool
) -> None:
    check_answer(http, render(body, ascii_only), "application/json", body)


@settings(FUZZ, max_examples=100)
@given(VALUES, st.booleans(), CONTENT_TYPES)
def test_arbitrary_json_bodies_are_answered_400(
    http: httpx.Client, value: Any, ascii_only: bool, content_type: str
) -> None:
    check_answer(http, render(value, ascii_only), content_type, value)


@settings(FUZZ, max_examples=100)
@given(
    st.one_of(
        st.binary(max_size=64),
        st.sampled_from(
            [
                b"",
                b"[" * 100_000,
                b'{"inputs": ' + b"[" * 2000,
                b"9" * 5000,
                b"\xef\xbb\xbf{}",
                b"\xff\xfe{\x00}\x00",
                b'{"id": "\xed\xa0\x80"}',
                b'{"id": "a\x00"}',
                b"NaN",
                b"{}" * 1000,
            ]
        ),
    ),
    CONTENT_TYPES,
)
def test_arbitrary_bytes_are_answered_400(http: httpx.Client, content: bytes, content_type: str) -> None:
    check_answer(http, content, content_type)
