// The official OpenAI JavaScript client against linattn-server over HTTPS
// with an API key: models, a streamed completion, and a wrong key thrown as
// the client's AuthenticationError (401). The test CA comes from
// NODE_EXTRA_CA_CERTS, as a user would give theirs.
//
//   NODE_EXTRA_CA_CERTS=ca.pem node openai_tls.mjs https://127.0.0.1:PORT KEY
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const [base, key] = process.argv.slice(2);
if (!base || !key) {
  console.error('usage: node openai_tls.mjs BASE_URL KEY');
  process.exit(2);
}
const watchdog = setTimeout(() => {
  console.error('FAIL: the checks took longer than 60 s');
  process.exit(1);
}, 60_000);
const client = (apiKey) =>
    new OpenAI({baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 20_000});

const models = await client(key).models.list();
assert.ok(models.data.length >= 1);
console.log(`ok    models over TLS: ${models.data.map((m) => m.id).join(', ')}`);

const stream = await client(key).completions.create(
    {model: models.data[0].id, prompt: 'And God said', max_tokens: 8,
     temperature: 0, stream: true});
let text = '', chunks = 0;
for await (const chunk of stream) {
  chunks++;
  text += chunk.choices[0]?.text ?? '';
}
assert.ok(chunks >= 8 && text.length > 0, `${chunks} chunks, ${text}`);
console.log(`ok    a streamed completion over TLS: ${JSON.stringify(text)}`);

await assert.rejects(client('not-a-key').models.list(), (e) => {
  assert.ok(e instanceof OpenAI.AuthenticationError, String(e));
  assert.equal(e.status, 401);
  assert.equal(e.code, 'invalid_api_key');
  return true;
});
console.log('ok    a wrong key is the client\'s AuthenticationError (401)');
clearTimeout(watchdog);
