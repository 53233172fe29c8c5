#!/usr/bin/env bash
# Mutation testing of the core modules with mutmut (not part of CI; tests/mutation/README.md).
#   bash tests/mutation/run.sh                  every ready module of modules.toml, one after the other
#   bash tests/mutation/run.sh checkpoint ...   these modules
#   bash tests/mutation/run.sh --all            also the modules being restructured
#   bash tests/mutation/run.sh --fresh NAME...  drop the modules' earlier results first
#   bash tests/mutation/run.sh --retest NAME... re-run only the mutants that were not killed
#   bash tests/mutation/run.sh --summary        the per-module table
# A stopped run resumes: mutants with a verdict are not run again (unless their function changed).
# Runs niced, one mutant at a time. MUTATION_WORK (default .mutation/) holds the results and a venv
# with the pinned mutmut (system site packages visible: the project's dependencies come from there).
set -euo pipefail
cd "$(dirname "$0")/../.."
MUTMUT_VERSION=3.8.1
export MUTATION_WORK=${MUTATION_WORK:-$PWD/.mutation}
VENV=$MUTATION_WORK/venv
PY=${PYTHON:-python3}

have() { "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('mutmut') != '$MUTMUT_VERSION')" 2>/dev/null; }
if ! have; then
    mkdir -p "$MUTATION_WORK"
    "$PY" -m venv --system-site-packages "$VENV"
    have || "$VENV/bin/pip" install -q "mutmut==$MUTMUT_VERSION"
fi
# the console script (pip does not write one when the system site already has this mutmut); the
# __main__ guard matters: processes the tests spawn re-run the main script
if [ ! -x "$VENV/bin/mutmut" ] || ! grep -q 'if __name__' "$VENV/bin/mutmut"; then
    printf '#!%s\nimport sys\nfrom mutmut.__main__ import cli\nif __name__ == "__main__":\n    sys.exit(cli())\n' \
        "$VENV/bin/python" > "$VENV/bin/mutmut"
    chmod +x "$VENV/bin/mutmut"
fi
export MUTMUT=$VENV/bin/mutmut
HELPER=("$VENV/bin/python" tests/mutation/mutation.py)

mode=run all=""
names=()
for arg in "$@"; do
    case "$arg" in
        --all) all=--all ;;
        --fresh) mode=fresh ;;
        --retest) mode=retest ;;
        --summary) mode=summary ;;
        -*) echo "run.sh: unknown option $arg" >&2; exit 2 ;;
        *) names+=("$arg") ;;
    esac
done
if [ "$mode" = summary ]; then
    exec "${HELPER[@]}" summary $all
fi
if [ ${#names[@]} -eq 0 ]; then
    mapfile -t names < <("${HELPER[@]}" list $all)
fi
status=0
for name in "${names[@]}"; do
    case "$mode" in
        run) "${HELPER[@]}" run "$name" || status=1 ;;
        fresh) "${HELPER[@]}" run --fresh "$name" || status=1 ;;
        retest) "${HELPER[@]}" retest "$name" || status=1 ;;
    esac
done
"${HELPER[@]}" summary $all
exit $status
