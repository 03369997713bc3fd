"""The official `openai` package against a live server (tiny float32 model): completions with echo and
log-probs, chat, streaming, n with a seed, the models list, and errors as the package's exceptions."""

import openai
import pytest
from live_server import live_server

from engine import Engine
from frontends.server.app import create_app


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return Engine.load(str(tiny_model_dir), dtype="float32")


@pytest.fixture(scope="module")
def client(tiny_model_dir):
    engine = Engine.load(str(tiny_model_dir), dtype="float32", keep_cache=True)
    with live_server(create_app(engine, model_name="tiny", api_key="k")) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=60)


def test_completion_echo_logprobs(client, reference):
    prompt = "The cat sat on the mat and"
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, echo=True, logprobs=2, temperature=0)
    choice = out.choices[0]
    ids = [reference.tokenizer.bos_id] + reference.tokenizer.encode(prompt)  # the tiny model asks for BOS
    gen = reference.generate([prompt], max_tokens=2)[0]
    assert choice.text == reference.tokenizer.decode(ids) + gen.text
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + len(gen.token_ids) and lp.token_logprobs[0] is None
    want = reference.score([(ids[:1], ids[1:] + gen.token_ids)])[0]
    assert lp.token_logprobs[1:] == pytest.approx(want.token_logprobs, abs=1e-5)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(lp.top_logprobs[i][lp.tokens[i]] == lp.token_logprobs[i] for i in range(1, len(lp.tokens)))
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == len(gen.token_ids)


def test_completion_batch_of_token_prompts_and_n(client, reference):
    prompts = [reference.tokenizer.encode("Once upon a time"), reference.tokenizer.encode("Hello")]
    out = client.completions.create(model="tiny", prompt=prompts, max_tokens=4, n=2, temperature=0.9, seed=5)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    again = client.completions.create(model="tiny", prompt=prompts, max_tokens=4, n=2, temperature=0.9, seed=5)
    assert [c.text for c in out.choices] == [c.text for c in again.choices]  # seeded: reproducible


def test_chat_and_chat_logprobs(client, reference):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    out = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    prompt = reference.tokenizer.apply_chat_template(messages)
    gen = reference.generate([reference.tokenizer.encode(prompt)], max_tokens=5)[0]
    msg = out.choices[0]
    assert msg.message.role == "assistant" and msg.message.content == gen.text
    assert len(msg.logprobs.content) == len(gen.token_ids)
    assert all(len(t.top_logprobs) == 2 for t in msg.logprobs.content)
    assert msg.finish_reason in ("stop", "length")


def test_streaming_completion_and_chat(client):
    full = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0)
    chunks = list(
        client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    messages = [{"role": "user", "content": "Hi"}]
    full = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    stream = list(
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, stream=True)
    )
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == full.choices[0].message.content


def test_models_and_errors(client, tiny_model_dir):
    assert [m.id for m in client.models.list()] == ["tiny"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi", logprobs=50)
    assert e.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="other", prompt="hi")
    assert e.value.body["param"] == "model"
    bad = openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="tiny", prompt="hi")
