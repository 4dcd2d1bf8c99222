// linattn-server's HTTP listener as the official OpenAI JavaScript client
// (npm `openai`) sees it: models, completions (whole, streamed, stop, n),
// chat completions (whole and streamed, with usage), the responses API
// with stored state (previous_response_id, retrieve, delete), and errors
// thrown as the client's own error classes with the server's status,
// param and message.
//
//   node openai_client.mjs BASE_URL      (BASE_URL = http://127.0.0.1:PORT)
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const base = process.argv[2];
if (!base) {
  console.error('usage: node openai_client.mjs BASE_URL');
  process.exit(2);
}
const watchdog = setTimeout(() => {
  console.error('FAIL: the checks took longer than 90 s');
  process.exit(1);
}, 90_000);

const client = new OpenAI({
  baseURL: `${base}/v1`,
  apiKey: 'not-needed',  // linattn takes any key until keys are configured
  maxRetries: 0,
  timeout: 30_000,
});

let checks = 0;
function ok(what) {
  checks++;
  console.log(`ok    ${what}`);
}

async function rejects(promise, status, param, what) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `${what}: not an APIError: ${e}`);
    assert.equal(e.status, status, `${what}: status ${e.status}: ${e.message}`);
    if (param !== undefined) assert.equal(e.param, param, `${what}: param`);
    assert.ok(e.message.length > 0);
    ok(`${what} → ${status}${param ? ` (param ${param})` : ''}: ${e.message}`);
    return;
  }
  assert.fail(`${what}: no error`);
}

async function main() {
  // Models.
  const models = [];
  for await (const m of client.models.list()) models.push(m);
  assert.ok(models.length >= 1);
  const model = models[0].id;
  assert.equal(models[0].object, 'model');
  const one = await client.models.retrieve(model);
  assert.equal(one.id, model);
  ok(`models: ${models.map((m) => m.id).join(', ')}`);

  // A completion, greedy.
  const prompt = 'In the beginning God created';
  const c = await client.completions.create({
    model, prompt, max_tokens: 24, temperature: 0,
  });
  assert.equal(c.object, 'text_completion');
  assert.equal(c.choices.length, 1);
  assert.equal(c.choices[0].finish_reason, 'length');
  assert.equal(c.usage.completion_tokens, 24);
  assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + 24);
  const greedy = c.choices[0].text;
  assert.ok(greedy.length > 0);
  ok(`completion: ${JSON.stringify(greedy)} (usage ${JSON.stringify(c.usage)})`);

  // Streamed: the same text, then usage.
  const stream = await client.completions.create({
    model, prompt, max_tokens: 24, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let streamed = '';
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) streamed += choice.text;
  }
  assert.equal(streamed, greedy);
  assert.equal(usage.completion_tokens, 24);
  ok(`streamed completion: the same text in ${chunks} chunks, then usage`);

  // stop: the text ends before it.
  const stopAt = greedy.slice(4, 6);
  const stopped = await client.completions.create({
    model, prompt, max_tokens: 24, temperature: 0, stop: [stopAt],
  });
  assert.equal(stopped.choices[0].text, greedy.slice(0, greedy.indexOf(stopAt)));
  assert.equal(stopped.choices[0].finish_reason, 'stop');
  ok(`stop ${JSON.stringify(stopAt)}: ${JSON.stringify(stopped.choices[0].text)}`);

  // n: several choices, each its own seed's stream from one prefill.
  const n = await client.completions.create({
    model, prompt, max_tokens: 10, temperature: 1, seed: 11, n: 3,
  });
  assert.equal(n.choices.length, 3);
  assert.deepEqual(n.choices.map((ch) => ch.index), [0, 1, 2]);
  const single = await client.completions.create({
    model, prompt, max_tokens: 10, temperature: 1, seed: 12,
  });
  assert.equal(n.choices[1].text, single.choices[0].text);
  ok(`n=3: ${n.choices.map((ch) => JSON.stringify(ch.text)).join(', ')}`);

  // Chat, whole and streamed.
  const messages = [
    { role: 'system', content: 'You answer briefly.' },
    { role: 'user', content: 'Who made the light?' },
  ];
  const chat = await client.chat.completions.create({
    model, messages, max_tokens: 20, temperature: 0,
  });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].message.role, 'assistant');
  const reply = chat.choices[0].message.content;
  const chatStream = await client.chat.completions.create({
    model, messages, max_tokens: 20, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let streamedReply = '';
  let role = null;
  let chatUsage = null;
  for await (const chunk of chatStream) {
    if (chunk.usage) chatUsage = chunk.usage;
    for (const choice of chunk.choices) {
      if (choice.delta.role) role = choice.delta.role;
      if (choice.delta.content) streamedReply += choice.delta.content;
    }
  }
  assert.equal(streamedReply, reply);
  assert.equal(role, 'assistant');
  assert.equal(chatUsage.completion_tokens, chat.usage.completion_tokens);
  ok(`chat: ${JSON.stringify(reply)}, streamed the same`);

  // Logprobs in chat.
  const lp = await client.chat.completions.create({
    model, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  assert.equal(lp.choices[0].logprobs.content.length, 4);
  for (const t of lp.choices[0].logprobs.content) {
    assert.equal(t.top_logprobs.length, 2);
    assert.ok(t.logprob <= 0);
  }
  ok('chat logprobs with top_logprobs');

  // Responses: stored state, continued by previous_response_id.
  const r1 = await client.responses.create({
    model, input: 'Who divided the light from the darkness?',
    max_output_tokens: 16, temperature: 0,
  });
  assert.equal(r1.object, 'response');
  assert.ok(typeof r1.output_text === 'string');
  const r2 = await client.responses.create({
    model, previous_response_id: r1.id, input: 'And then?',
    max_output_tokens: 12, temperature: 0,
  });
  assert.equal(r2.previous_response_id, r1.id);
  assert.ok(r2.usage.input_tokens_details.cached_tokens > 0);
  const again = await client.responses.retrieve(r1.id);
  assert.equal(again.id, r1.id);
  assert.equal(again.output_text ?? again.output[0].content[0].text, r1.output_text);
  ok(`responses: ${r2.id} continues ${r1.id} (cached ${r2.usage.input_tokens_details.cached_tokens} tokens)`);

  // Streamed response events.
  const rs = await client.responses.create({
    model, previous_response_id: r1.id, input: 'And then?',
    max_output_tokens: 12, temperature: 0, stream: true,
  });
  let deltas = '';
  let completed = null;
  for await (const event of rs) {
    if (event.type === 'response.output_text.delta') deltas += event.delta;
    if (event.type === 'response.completed' || event.type === 'response.incomplete') {
      completed = event.response;
    }
  }
  assert.equal(deltas, r2.output_text);
  assert.ok(completed);
  ok('streamed response: the same text as the stored follow-up (a branch of one state)');

  await client.responses.delete(r1.id);
  await rejects(client.responses.retrieve(r1.id), 404, undefined, 'a deleted response');

  // Errors, as the client's error classes.
  await rejects(client.completions.create({ model, prompt: 'x', temperature: 7 }),
                400, 'temperature', 'temperature 7');
  await rejects(client.completions.create({ model: 'gpt-4o', prompt: 'x' }),
                404, 'model', 'an unknown model');
  await rejects(client.chat.completions.create({ model, messages: [] }),
                400, 'messages', 'no messages');
  await rejects(client.completions.create({ model, prompt: 'x', max_tokens: 0 }),
                400, 'max_tokens', 'max_tokens 0');
  await rejects(client.responses.create({ model, previous_response_id: 'resp_nope', input: 'x' }),
                404, 'previous_response_id', 'an unknown previous response');
  try {
    await client.completions.create({ model, prompt: 'x', temperature: 7 });
  } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError);
  }
  ok('a 400 is the client\'s BadRequestError');

  console.log(`PASS (${checks} checks)`);
}

main().then(
  () => { clearTimeout(watchdog); },
  (e) => {
    console.error(`FAIL: ${e.stack || e}`);
    process.exit(1);
  },
);
