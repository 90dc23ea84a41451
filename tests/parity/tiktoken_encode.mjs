// Writes tiktoken's "gpt2" encode_ordinary ids for text files: the reference that
// tests/unit/gpt2_parity_test.cc holds agora's Gpt2Tokenizer to.
//
//   node tiktoken_encode.mjs [--tiktoken DIR] [--list FILE] [--out FILE] [FILE...]
//
// Output (to --out FILE, else stdout): one line per input file, in order: the ids separated by spaces (an empty line for an
// empty file). Files are read as UTF-8 with invalid bytes replaced by U+FFFD, as agora repairs.
// tiktoken is found at --tiktoken DIR, else $AGORA_TIKTOKEN_DIR, else the project's
// deps/node_modules/tiktoken.
import {closeSync, openSync, readFileSync, writeSync} from 'node:fs';
import {createRequire} from 'node:module';
import {dirname, join, resolve} from 'node:path';
import {fileURLToPath} from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
let tiktokenDir = process.env.AGORA_TIKTOKEN_DIR ||
    join(here, '..', '..', 'deps', 'node_modules', 'tiktoken');
let out = 1;
const files = [];
const args = process.argv.slice(2);
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--tiktoken') {
    tiktokenDir = args[++i];
  } else if (args[i] === '--out') {
    out = openSync(args[++i], 'w');
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
  console.error(`tiktoken_encode: cannot load tiktoken from ${tiktokenDir}: ${e.message}` +
                ' (run scripts/setup.sh, or pass --tiktoken DIR)');
  process.exit(2);
}
const encoding = tiktoken.get_encoding('gpt2');

// Writes in large chunks: the ids of a corpus are tens of megabytes of text.
let buffer = '';
const flush = () => {
  const bytes = Buffer.from(buffer, 'utf8');
  let offset = 0;
  while (offset < bytes.length) {
    try {
      offset += writeSync(out, bytes, offset, bytes.length - offset);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;  // a non-blocking pipe that is full: try again
    }
  }
  buffer = '';
};
for (const file of files) {
  const ids = encoding.encode_ordinary(readFileSync(file, 'utf8'));
  buffer += ids.join(' ') + '\n';
  if (buffer.length > (1 << 22)) flush();
}
flush();
if (out !== 1) closeSync(out);
encoding.free();
