// The official openai npm client against ep-server: models, chat and completions, whole and
// streamed (the streamed text equals the whole one for greedy requests), usage with
// stream_options.include_usage, tool calls (a named tool_choice, whole and streamed, the SDK
// folding the streamed deltas; a tool message round trip), logprobs / top_logprobs, n = 2,
// logit_bias, JSON mode (response_format json_schema whole and streamed, json_object, a schema
// refused by name), and the client's error classes for refused requests.
//   node openai_client.cjs BASE_URL API_KEY OPENAI_PACKAGE_DIR
'use strict';
const assert = require('node:assert/strict');
const [baseURL, apiKey, pkg] = process.argv.slice(2);
const { OpenAI } = require(pkg);

async function main() {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 600000 });

  const models = await client.models.list();
  const ids = [];
  for await (const m of models) ids.push(m.id);
  assert.deepEqual(ids, ['demo-kjv']);
  assert.equal((await client.models.retrieve('demo-kjv')).id, 'demo-kjv');

  const chat = {
    model: 'demo-kjv',
    messages: [{ role: 'system', content: 'Answer with a verse.' }, { role: 'user', content: 'John 3:16' }],
    temperature: 0,
    max_tokens: 24,
  };
  const whole = await client.chat.completions.create(chat);
  assert.equal(whole.object, 'chat.completion');
  const text = whole.choices[0].message.content;
  assert.ok(text.length > 0, 'an empty chat answer');
  assert.equal(whole.choices[0].message.role, 'assistant');
  assert.ok(whole.usage.completion_tokens > 0 && whole.usage.completion_tokens <= 24);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);

  const stream = await client.chat.completions.create({ ...chat, stream: true, stream_options: { include_usage: true } });
  let streamed = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      streamed += choice.delta.content ?? '';
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  assert.equal(streamed, text);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.ok(usage, 'no usage chunk');
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);

  // The second conversation turn continues the first turn's kept state.
  const next = await client.chat.completions.create({
    ...chat,
    messages: [...chat.messages, { role: 'assistant', content: text }, { role: 'user', content: 'Psalms 23:1' }],
    max_tokens: 8,
  });
  assert.ok(next.usage.prompt_tokens_details.cached_tokens > 0, 'nothing of the first turn was reused');

  const completion = { model: 'demo-kjv', prompt: 'And God said', temperature: 0, max_tokens: 16 };
  const c = await client.completions.create(completion);
  assert.equal(c.object, 'text_completion');
  assert.ok(c.choices[0].text.length > 0, 'an empty completion');
  let ctext = '';
  for await (const chunk of await client.completions.create({ ...completion, stream: true })) ctext += chunk.choices[0]?.text ?? '';
  assert.equal(ctext, c.choices[0].text);

  // Tool calls. The demo model writes no meaningful arguments: the structure is checked (the
  // parsing of real calls is server_tool_calls_test's).
  const tools = [{
    type: 'function',
    function: { name: 'get_weather', description: 'The weather in a city', parameters: { type: 'object', properties: { location: { type: 'string' } }, required: ['location'] } },
  }];
  const toolChat = {
    model: 'demo-kjv',
    messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
    temperature: 0,
    max_tokens: 6,
  };
  const called = await client.chat.completions.create(toolChat);
  const calls = called.choices[0].message.tool_calls;
  assert.equal(calls.length, 1);
  assert.equal(calls[0].type, 'function');
  assert.ok(calls[0].id.startsWith('call_'));
  assert.equal(calls[0].function.name, 'get_weather');
  assert.equal(typeof JSON.parse(calls[0].function.arguments), 'object');
  assert.ok(['tool_calls', 'length'].includes(called.choices[0].finish_reason), called.choices[0].finish_reason);
  // Streamed, folded by the SDK's own stream helper: the same call.
  const folded = await client.chat.completions.stream(toolChat).finalChatCompletion();
  const streamedCalls = folded.choices[0].message.tool_calls;
  assert.equal(streamedCalls.length, 1);
  assert.equal(streamedCalls[0].function.name, 'get_weather');
  assert.equal(streamedCalls[0].function.arguments, calls[0].function.arguments);
  assert.equal(folded.choices[0].finish_reason, called.choices[0].finish_reason);
  // The call and its result sent back.
  const answered = await client.chat.completions.create({
    model: 'demo-kjv',
    messages: [...toolChat.messages, called.choices[0].message, { role: 'tool', tool_call_id: calls[0].id, content: '21 C and clear' }],
    tools,
    temperature: 0,
    max_tokens: 4,
  });
  assert.equal(answered.choices[0].message.role, 'assistant');
  assert.ok(answered.usage.prompt_tokens > called.usage.prompt_tokens);
  await assert.rejects(
    client.chat.completions.create({ ...toolChat, tool_choice: { type: 'function', function: { name: 'fly' } } }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'tool_choice',
  );

  // logprobs and top_logprobs (chat), whole and streamed: one entry per answer token, the
  // alternatives sorted, the greedy token first among them with its own log-probability.
  const lpChat = { ...chat, max_tokens: 8, logprobs: true, top_logprobs: 3 };
  const lpWhole = await client.chat.completions.create(lpChat);
  const entries = lpWhole.choices[0].logprobs.content;
  assert.equal(entries.length, lpWhole.usage.completion_tokens - (lpWhole.choices[0].finish_reason === 'stop' ? 1 : 0));
  assert.equal(entries.map((e) => e.token).join(''), lpWhole.choices[0].message.content);
  for (const e of entries) {
    assert.ok(e.logprob <= 0);
    assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
    assert.equal(e.top_logprobs.length, 3);
    for (let i = 1; i < 3; ++i) assert.ok(e.top_logprobs[i].logprob <= e.top_logprobs[i - 1].logprob);
    assert.equal(e.top_logprobs[0].token, e.token);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
  }
  const lpStreamed = [];
  for await (const chunk of await client.chat.completions.create({ ...lpChat, stream: true }))
    for (const choice of chunk.choices) lpStreamed.push(...(choice.logprobs?.content ?? []));
  assert.deepEqual(lpStreamed, entries);
  await assert.rejects(client.chat.completions.create({ ...chat, top_logprobs: 2 }), (e) => e instanceof OpenAI.BadRequestError && e.param === 'top_logprobs');

  // Legacy completions: logprobs K, whole and streamed.
  const lpCompletion = { model: 'demo-kjv', prompt: 'And God said', temperature: 0, max_tokens: 6, logprobs: 2 };
  const lc = await client.completions.create(lpCompletion);
  const clp = lc.choices[0].logprobs;
  assert.equal(clp.tokens.join(''), lc.choices[0].text);
  assert.equal(clp.token_logprobs.length, clp.tokens.length);
  assert.equal(clp.top_logprobs.length, clp.tokens.length);
  assert.equal(clp.text_offset[0], 0);
  for (let i = 0; i < clp.tokens.length; ++i) {
    assert.ok(Object.keys(clp.top_logprobs[i]).length >= 1);
    assert.equal(Math.max(...Object.values(clp.top_logprobs[i])), clp.token_logprobs[i]);
  }
  const streamedTokens = [];
  for await (const chunk of await client.completions.create({ ...lpCompletion, stream: true }))
    for (const choice of chunk.choices) streamedTokens.push(...(choice.logprobs?.tokens ?? []));
  assert.deepEqual(streamedTokens, clp.tokens);

  // n = 2: greedy answers are equal; sampled ones with a seed come back the same way twice, and
  // the prompt is counted once.
  const two = await client.chat.completions.create({ ...chat, max_tokens: 8, n: 2 });
  assert.equal(two.choices.length, 2);
  assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
  assert.equal(two.choices[0].message.content, two.choices[1].message.content);
  assert.equal(two.usage.prompt_tokens, whole.usage.prompt_tokens);
  const seeded = { ...chat, max_tokens: 8, n: 2, temperature: 1.0, seed: 42 };
  const s1 = await client.chat.completions.create(seeded);
  const byIndex = ['', ''];
  for await (const chunk of await client.chat.completions.create({ ...seeded, stream: true }))
    for (const choice of chunk.choices) byIndex[choice.index] += choice.delta.content ?? '';
  assert.deepEqual(byIndex, s1.choices.map((c) => c.message.content));
  // Answer 1 is the answer of seed + 1 alone.
  const alone = await client.chat.completions.create({ ...seeded, n: 1, seed: 43 });
  assert.equal(alone.choices[0].message.content, s1.choices[1].message.content);
  const ctwo = await client.completions.create({ ...completion, max_tokens: 6, n: 2 });
  assert.equal(ctwo.choices.length, 2);
  assert.equal(ctwo.choices[0].text, ctwo.choices[1].text);

  // logit_bias with token ids as strings: +100 on one token makes every answer token that one.
  const biased = await client.completions.create({ ...completion, max_tokens: 3, logit_bias: { '7': 100 }, logprobs: 0 });
  const forced = biased.choices[0].logprobs.tokens;
  assert.equal(forced.length, 3);
  assert.ok(forced.every((t) => t === forced[0]));
  await assert.rejects(client.completions.create({ ...completion, logit_bias: { x: 1 } }), (e) => e instanceof OpenAI.BadRequestError && e.param === 'logit_bias');

  // JSON mode. A schema with no free strings (an enum, integers, booleans, a bounded array), so
  // that even greedy decoding ends well inside max_tokens: the answer parses and follows it.
  const schema = {
    type: 'object',
    properties: {
      book: { enum: ['Genesis', 'Exodus', 'John'] },
      chapter: { type: 'integer' },
      verses: { type: 'array', items: { type: 'integer' }, minItems: 1, maxItems: 2 },
      amen: { type: 'boolean' },
    },
    required: ['book', 'chapter', 'verses', 'amen'],
    additionalProperties: false,
  };
  const jsonChat = { ...chat, max_tokens: 300, response_format: { type: 'json_schema', json_schema: { name: 'verse', schema, strict: true } } };
  const structured = await client.chat.completions.create(jsonChat);
  assert.equal(structured.choices[0].finish_reason, 'stop');
  const value = JSON.parse(structured.choices[0].message.content);
  assert.deepEqual(Object.keys(value).sort(), ['amen', 'book', 'chapter', 'verses']);
  assert.ok(['Genesis', 'Exodus', 'John'].includes(value.book));
  assert.ok(Number.isInteger(value.chapter));
  assert.ok(Array.isArray(value.verses) && value.verses.length >= 1 && value.verses.length <= 2 && value.verses.every(Number.isInteger));
  assert.equal(typeof value.amen, 'boolean');
  let structuredStreamed = '';
  for await (const chunk of await client.chat.completions.create({ ...jsonChat, stream: true })) {
    for (const choice of chunk.choices) structuredStreamed += choice.delta.content ?? '';
  }
  assert.equal(structuredStreamed, structured.choices[0].message.content);
  const anyObject = await client.chat.completions.create({ ...chat, max_tokens: 300, temperature: 1.0, seed: 3, response_format: { type: 'json_object' } });
  if (anyObject.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(anyObject.choices[0].message.content), 'object');
  else assert.ok(anyObject.choices[0].message.content.trimStart().startsWith('{'));
  await assert.rejects(
    client.chat.completions.create({ ...jsonChat, response_format: { type: 'json_schema', json_schema: { name: 'v', schema: { type: 'string', pattern: 'x' } } } }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'response_format.json_schema.schema' && e.message.includes('pattern'));

  await assert.rejects(client.chat.completions.create({ ...chat, model: 'gpt-nothing' }), (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
  await assert.rejects(client.chat.completions.create({ ...chat, temperature: 'hot' }), (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature');
  const anonymous = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(anonymous.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  console.log('openai client: ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
