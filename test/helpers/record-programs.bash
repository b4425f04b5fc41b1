# BASH_ENV of the test suite (set by programs.hooks.ts): every bash script the suite runs appends the first word
# of each simple command to $FERRY_PROGRAM_LOG (once per word and process); programs.hooks.ts keeps those that
# name a program on PATH. Silent, and never fails the script it is loaded into.
if [[ -n "${FERRY_PROGRAM_LOG:-}" && $- != *i* ]]; then
  declare -A __ferry_seen=()
  __ferry_record() {
    local -a words
    local w
    read -r -a words <<< "$1" || true
    for w in "${words[@]}"; do
      case $w in
        *=*|exec|env|nohup|nice|!|'('|'{') continue ;;
        command|type|hash|'$'*|*'`'*|*'$('*) return 0 ;;  # a lookup, or a name only known at run time
      esac
      if [[ -z ${__ferry_seen[$w]:-} ]]; then
        __ferry_seen[$w]=1
        printf '%s\n' "$w" >> "$FERRY_PROGRAM_LOG" 2>/dev/null || true
      fi
      return 0
    done
    return 0
  }
  set -T
  trap '__ferry_record "$BASH_COMMAND"' DEBUG
fi
