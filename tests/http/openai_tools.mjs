// Tool calling through the official OpenAI JavaScript client (npm
// `openai`) against a model that calls a tool (make_tool_model.py): the
// call comes back as tool_calls, whole and streamed; the call and the
// tool's result go back in as the client writes them; tool_choice "none"
// leaves the reply as text, and "required" is refused with its param.
//
//   node openai_tools.mjs BASE_URL FOLLOW_UP_JSON
// FOLLOW_UP_JSON: where the follow-up request and its prompt_tokens are
// written, for the check of its rendering against jinja2.
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import {writeFileSync} from 'node:fs';

const [base, followUpPath] = process.argv.slice(2);
if (!base || !followUpPath) {
  console.error('usage: node openai_tools.mjs BASE_URL FOLLOW_UP_JSON');
  process.exit(2);
}
const watchdog = setTimeout(() => {
  console.error('FAIL: the checks took longer than 60 s');
  process.exit(1);
}, 60_000);
const client = new OpenAI(
    {baseURL: `${base}/v1`, apiKey: 'not-needed', maxRetries: 0, timeout: 30_000});

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather at a place.',
    parameters: {
      type: 'object',
      properties: {location: {type: 'string', description: 'City'}},
      required: ['location'],
    },
  },
}];
const ask = {role: 'user', content: 'What is the weather in Paris?'};

const whole = await client.chat.completions.create(
    {model: 'tools', messages: [ask], tools, max_tokens: 8, temperature: 0});
const choice = whole.choices[0];
assert.equal(choice.finish_reason, 'tool_calls');
assert.equal(choice.message.content, null);
assert.equal(choice.message.tool_calls.length, 1);
const call = choice.message.tool_calls[0];
assert.equal(call.type, 'function');
assert.match(call.id, /^call_/);
assert.equal(call.function.name, 'get_weather');
assert.deepEqual(JSON.parse(call.function.arguments), {location: 'Paris'});
console.log(`ok    a call: ${call.function.name}(${call.function.arguments})`);

const stream = await client.chat.completions.create(
    {model: 'tools', messages: [ask], tools, max_tokens: 8, temperature: 0,
     stream: true});
let content = '';
const calls = [];
let finish = null;
for await (const chunk of stream) {
  const c = chunk.choices[0];
  if (!c) continue;
  content += c.delta.content ?? '';
  for (const t of c.delta.tool_calls ?? []) calls[t.index] = t;
  if (c.finish_reason) finish = c.finish_reason;
}
assert.equal(finish, 'tool_calls');
assert.equal(content, '');  // no <tool_call> text leaks into the content
assert.equal(calls.length, 1);
assert.equal(calls[0].function.name, 'get_weather');
assert.deepEqual(JSON.parse(calls[0].function.arguments), {location: 'Paris'});
console.log('ok    streamed, the call is one tool_calls delta');

// The call and its result go back as the client writes them.
const followUp = {
  model: 'tools',
  messages: [ask, choice.message,
             {role: 'tool', tool_call_id: call.id, content: '{"temp_c": 21}'}],
  tools, max_tokens: 8, temperature: 0,
};
const next = await client.chat.completions.create(followUp);
assert.ok(next.usage.prompt_tokens > whole.usage.prompt_tokens);
writeFileSync(followUpPath, JSON.stringify(
    {request: followUp, prompt_tokens: next.usage.prompt_tokens}));
console.log(`ok    the result goes back: ${next.usage.prompt_tokens} prompt tokens`);

const none = await client.chat.completions.create(
    {model: 'tools', messages: [ask], tools, tool_choice: 'none',
     max_tokens: 8, temperature: 0});
assert.equal(none.choices[0].message.tool_calls, undefined);
assert.match(none.choices[0].message.content, /^<tool_call>/);
console.log('ok    tool_choice "none": the reply is text');

await assert.rejects(
    client.chat.completions.create(
        {model: 'tools', messages: [ask], tools, tool_choice: 'required'}),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 &&
        e.param === 'tool_choice');
console.log('ok    tool_choice "required" is refused, naming tool_choice');
clearTimeout(watchdog);
