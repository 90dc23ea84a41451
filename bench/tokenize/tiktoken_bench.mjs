// The tiktoken side of bench_tokenize: encode_ordinary with the "gpt2" encoding over the given
// files, single-threaded, timing only the encoding (files are read and the encoder built first).
//
//   node tiktoken_bench.mjs [--tiktoken DIR] [--repeats N] [--list FILE] [FILE...]
//
// Prints one JSON object: {"bytes", "documents", "tokens", "seconds": [one per repeat]}.
import {readFileSync, statSync} from 'node:fs';
import {createRequire} from 'node:module';
import {dirname, join, resolve} from 'node:path';
import {fileURLToPath} from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
let tiktokenDir = process.env.AGORA_TIKTOKEN_DIR ||
    join(here, '..', '..', 'deps', 'node_modules', 'tiktoken');
let repeats = 5;
const files = [];
const args = process.argv.slice(2);
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--tiktoken') {
    tiktokenDir = args[++i];
  } else if (args[i] === '--repeats') {
    repeats = Number(args[++i]);
  } else if (args[i] === '--list') {
    for (const line of readFileSync(args[++i], 'utf8').split('\n')) {
      if (line !== '') files.push(line);
    }
  } else {
    files.push(args[i]);
  }
}

const require = createRequire(import.meta.url);
let tiktoken;
try {
  tiktoken = require(resolve(tiktokenDir));
} catch (e) {
  console.error(`tiktoken_bench: cannot load tiktoken from ${tiktokenDir}: ${e.message}`);
  process.exit(2);
}

let bytes = 0;
const texts = files.map((f) => {
  bytes += statSync(f).size;
  return readFileSync(f, 'utf8');
});
const encoding = tiktoken.get_encoding('gpt2');

const pass = () => {
  let tokens = 0;
  for (const text of texts) tokens += encoding.encode_ordinary(text).length;
  return tokens;
};
const tokens = pass();  // warm-up: WASM compilation tiers, caches
const seconds = [];
for (let r = 0; r < repeats; ++r) {
  const start = process.hrtime.bigint();
  pass();
  seconds.push(Number(process.hrtime.bigint() - start) / 1e9);
}
encoding.free();
console.log(JSON.stringify({bytes, documents: texts.length, tokens, seconds}));
