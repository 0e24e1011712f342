"""Hypothesis strategies of `/v1/chat/completions` bodies: right, wrong and odd values of every field."""

from __future__ import annotations

from hypothesis import strategies as st

MODEL = "smollm2-135m-instruct"

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.integers(2**62, 2**66),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.lists(st.text(max_size=2), max_size=5),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
MESSAGES = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["system", "user", "assistant", "tool", "robot", ""]),
                "content": st.one_of(st.text(max_size=5), st.none(), VALUES),
            }
        ),
        VALUES,
    ),
    max_size=3,
)
BODIES = st.fixed_dictionaries(
    {"model": st.one_of(st.just(MODEL), st.just(""), VALUES), "messages": st.one_of(MESSAGES, VALUES)},
    optional={
        key: VALUES
        for key in [
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "n",
            "stop",
            "seed",
            "stream",
            "logprobs",
        ]
    },
)
