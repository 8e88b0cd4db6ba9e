#!/usr/bin/env bash
# The tokenizer and text-generation subcommands end to end, on the tiny test tokenizer and the tiny
# bf16 checkpoint (needs no npm packages).
# usage: cli_test.sh SPARROW_BINARY FIXTURES_DIR WORKDIR
set -euo pipefail
sparrow=$1 fixtures=$2 work=$3
tok=$fixtures/tokenizer/tiny
model=$fixtures/mixed_bf16
mkdir -p "$work"
fails=0 passes=0
check() {  # check NAME GOT WANT
  if [ "$2" == "$3" ]; then passes=$((passes + 1)); else echo "FAIL $1: got '$2', want '$3'"; fails=$((fails + 1)); fi
}

# tokenize: 'H' and 'i' are ids 44 and 77 of the tiny alphabet (see its make_tiny_tokenizer.py);
# no BOS unless asked for.
check tokenize "$("$sparrow" tokenize --tokenizer "$tok" --text "Hi")" "[44,77]"
check tokenize_bos "$("$sparrow" tokenize --tokenizer "$tok/tokenizer.json" --text "Hi" --add-special-tokens)" "[0,44,77]"

# A file round trip through tokenize and detokenize (ids passed as the JSON file tokenize wrote).
printf 'The capital of France is Paris.\n\tline two  <think>x</think>\n' > "$work/in.txt"
"$sparrow" tokenize --tokenizer "$tok" --in "$work/in.txt" > "$work/ids.json"
"$sparrow" detokenize --tokenizer "$tok" --ids "$work/ids.json" > "$work/out.txt"
if cmp -s "$work/in.txt" "$work/out.txt"; then passes=$((passes + 1)); else echo "FAIL roundtrip"; fails=$((fails + 1)); fi
check detokenize_list "$("$sparrow" detokenize --tokenizer "$tok" --ids 44,77,126)" "Hi｜DSML｜"

# render-chat: the spec's chat-mode example.
check render_chat "$(echo '[{"role": "user", "content": "Hi"}]' | "$sparrow" render-chat --messages -)" \
  "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>"
check render_chat_ids "$(echo '[{"role": "user", "content": "Hi"}]' | "$sparrow" render-chat --messages - --ids --tokenizer "$tok")" \
  "[0,122,44,77,123,125]"

# run at temperature 0 gives the ids `generate` (greedy) gives for the same prompt ids.
ids_of() { sed -n "s/^sparrow: $1 ids //p" "$2"; }
"$sparrow" run --model "$model" --tokenizer "$tok" "Hello there" -n 12 --temperature 0 --show-ids > "$work/run.txt" 2> "$work/run.err"
prompt=$(ids_of prompt "$work/run.err")
generated=$(ids_of generated "$work/run.err")
check run_prompt_ids "$prompt" "0,$("$sparrow" tokenize --tokenizer "$tok" --text "Hello there" | tr -d '[]')"
greedy=$("$sparrow" generate --model "$model" --ids "$prompt" -n 12 2>/dev/null)
# run stops early at EOS (id 1); compare the common prefix length of what run produced.
n=$(echo "$generated" | tr ',' '\n' | wc -l)
check run_equals_generate "$generated" "$(echo "$greedy" | cut -d, -f1-"$n")"
# The text printed is the decoded ids.
check run_text "$(cat "$work/run.txt")" "$("$sparrow" detokenize --tokenizer "$tok" --ids "$generated" | sed 's/<｜end▁of▁sentence｜>$//')"

# Sampling is reproducible for a seed.
a=$("$sparrow" run --model "$model" --tokenizer "$tok" "Hello" -n 16 --temperature 1.2 --top-p 0.9 --top-k 50 --min-p 0.01 --repetition-penalty 1.1 --seed 7 --show-ids 2>&1 >/dev/null | grep "generated ids")
b=$("$sparrow" run --model "$model" --tokenizer "$tok" "Hello" -n 16 --temperature 1.2 --top-p 0.9 --top-k 50 --min-p 0.01 --repetition-penalty 1.1 --seed 7 --show-ids 2>&1 >/dev/null | grep "generated ids")
check run_seed "$a" "$b"

# Chat and thinking modes run; the prompt ends with </think> or <think>.
"$sparrow" -v run --model "$model" --tokenizer "$tok" --chat "Hi" -n 4 --temperature 0 2> "$work/chat.err" > /dev/null
check run_chat_prompt "$(grep -c 'prompt text: <｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>$' "$work/chat.err")" "1"
"$sparrow" -v run --model "$model" --tokenizer "$tok" --think --system "Be brief." "Hi" -n 4 --temperature 0 2> "$work/think.err" > /dev/null
check run_think_prompt "$(grep -c 'prompt text: <｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>$' "$work/think.err")" "1"

# --stop: the stop string is not printed, generation ends there.
p="The capital of France is"
full=$("$sparrow" run --model "$model" --tokenizer "$tok" "$p" -n 30 --temperature 0 2>/dev/null)
stop=${full:8:3}
want=${full%%"$stop"*}
check run_stop_sanity "$([ ${#full} -gt 12 ] && [ ${#want} -lt ${#full} ] && echo ok)" "ok"
check run_stop "$("$sparrow" run --model "$model" --tokenizer "$tok" "$p" -n 30 --temperature 0 --stop "$stop" 2>/dev/null)" "$want"

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
