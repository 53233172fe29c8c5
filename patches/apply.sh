#!/usr/bin/env bash
# Apply our DP-batch-balance patch series to an upstream MindSpeed-RL or verl tree
# (a verl tree is one with verl/version/version; its series is picked by that version).
# Run with --help for usage. A git checkout is patched with `git apply --3way`,
# any other tree with `patch -p1` (the binary figure goes through `git apply`
# when git is installed). Exit codes: 0 ok, 1 nothing fits, 2 usage error.
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
series_root="$here/mindspeed-rl"
verl_root="$here/verl"
project="mindspeed-rl"

usage() {
    cat >&2 <<USAGE
usage: bash patches/apply.sh <upstream-dir> [--check] [--series <commit|version>]

Applies the DP-batch-balance patch series that fits an upstream MindSpeed-RL
tree or a verl source tree. Supported upstream commits (MindSpeed-RL):
$(supported_series "$here/mindspeed-rl" | tr '\n' ' ')
Supported verl releases: $(supported_series "$verl_root" | tr '\n' ' ')

  --check            only dry-run: report which series fits, change nothing
  --series <commit>  use this series instead of detecting one

Exit codes: 0 applied / would apply / already applied, 1 nothing fits,
2 usage error.
USAGE
}

die_usage() {
    echo "apply.sh: $*" >&2
    echo >&2
    usage
    exit 2
}

supported_series() {  # [series root]
    local d
    for d in "${1:-$series_root}"/*/; do
        [ -d "$d" ] && basename "$d"
    done
}

describe_series() {
    case "$1" in
        7466375*) echo "parent of the upstream change that added use_dp_batch_balance" ;;
        05a90d7*) echo "upstream head that already has use_dp_batch_balance (heap partition, per-call re-partition)" ;;
        0.9.1) echo "verl release 0.9.1 (Karmarkar-Karp balance_batch, 7B workload constant)" ;;
        *) echo "" ;;
    esac
}

# ------------------------------------------------------------------ arguments

dir=""
check_only=0
forced=""
while [ $# -gt 0 ]; do
    case "$1" in
        --check) check_only=1 ;;
        --series)
            [ $# -ge 2 ] || die_usage "--series needs a commit id"
            forced="$2"; shift ;;
        --series=*) forced="${1#--series=}" ;;
        -h|--help) usage; exit 0 ;;
        -*) die_usage "unknown option '$1'" ;;
        *)
            [ -z "$dir" ] || die_usage "more than one directory given ('$dir', '$1')"
            dir="$1" ;;
    esac
    shift
done
[ -n "$dir" ] || die_usage "no upstream directory given"
[ -e "$dir" ] || die_usage "'$dir' does not exist"
[ -d "$dir" ] || die_usage "'$dir' is not a directory"
dir="$(cd "$dir" && pwd -P)"

# a verl tree carries its release in verl/version/version
verl_version=""
if [ -f "$dir/verl/version/version" ] || [ -f "$dir/verl/utils/seqlen_balancing.py" ]; then
    project="verl"
    series_root="$verl_root"
    if [ -f "$dir/verl/version/version" ]; then
        verl_version="$(tr -d ' \r\n' < "$dir/verl/version/version")"
    fi
fi

if [ -n "$forced" ]; then
    match=""
    for s in $(supported_series); do
        # a prefix of the series id, or a longer id that starts with it
        case "$s" in "$forced"*) match="$s" ;; esac
        case "$forced" in "$s"*) match="$s" ;; esac
    done
    [ -n "$match" ] || die_usage "no series for '$forced' (have: $(supported_series | tr '\n' ' '))"
    forced="$match"
fi

have_git=0; command -v git >/dev/null 2>&1 && have_git=1
have_patch=0; command -v patch >/dev/null 2>&1 && have_patch=1
if [ $have_git = 0 ] && [ $have_patch = 0 ]; then
    echo "apply.sh: neither git nor patch is installed; install one of them" >&2
    exit 2
fi

# A git checkout counts only when <dir> is its top level: a plain tree that
# happens to sit inside another repository is patched as a plain tree.
is_git=0
head=""
if [ $have_git = 1 ]; then
    top="$(git -C "$dir" rev-parse --show-toplevel 2>/dev/null || true)"
    if [ -n "$top" ] && [ "$(cd "$top" && pwd -P)" = "$dir" ]; then
        is_git=1
        head="$(git -C "$dir" rev-parse HEAD 2>/dev/null || true)"
    fi
fi

# git run on a plain tree must not find a repository above it
plain_git() {
    GIT_CEILING_DIRECTORIES="$(dirname "$dir")" git -C "$dir" "$@"
}

patches_of() {
    ls "$series_root/$1"/*.patch 2>/dev/null | sort
}

# Split a patch into the text part (for patch -p1) and the binary part.
split_patch() {  # <patch> <text-out> <binary-out>
    awk -v text="$2" -v bin="$3" '
        function flush() {
            if (block == "") return
            if (isbin) printf "%s", block > bin; else printf "%s", block > text
            block = ""; isbin = 0
        }
        /^diff --git / { flush(); inblock = 1 }
        {
            if (!inblock) { print > text; next }
            block = block $0 "\n"
            if ($0 == "GIT binary patch") isbin = 1
        }
        END { flush() }
    ' "$1"
    touch "$2" "$3"
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# ------------------------------------------------------------------ dry runs

check_git() {  # <series> [--reverse]
    local list
    list=$(patches_of "$1")
    [ -n "$list" ] || return 1
    # shellcheck disable=SC2086
    git -C "$dir" apply --check ${2:-} $list >/dev/null 2>&1 && return 0
    [ -z "${2:-}" ] || return 1
    # shellcheck disable=SC2086
    git -C "$dir" apply --check --3way $list >/dev/null 2>&1
}

check_plain() {  # <series> [--reverse]
    local p n=0 list
    list=$(patches_of "$1")
    [ -n "$list" ] || return 1
    if [ $have_patch = 0 ]; then
        # shellcheck disable=SC2086
        plain_git apply --check ${2:-} $list >/dev/null 2>&1
        return
    fi
    for p in $list; do
        n=$((n + 1))
        split_patch "$p" "$tmp/t$n" "$tmp/b$n"
        if [ "${2:-}" = "--reverse" ]; then
            # -f: without it patch -t takes an unapplied patch for a reversed one and reports success
            patch -p1 -R -f -s --dry-run -d "$dir" < "$tmp/t$n" >/dev/null 2>&1 || return 1
        else
            patch -p1 -N -t -s --dry-run -d "$dir" < "$tmp/t$n" >/dev/null 2>&1 || return 1
        fi
        if [ -s "$tmp/b$n" ] && [ $have_git = 1 ]; then
            # shellcheck disable=SC2086
            plain_git apply --check ${2:-} "$tmp/b$n" >/dev/null 2>&1 || return 1
        fi
    done
    return 0
}

fits() {  # <series>
    if [ $is_git = 1 ]; then check_git "$1"; else check_plain "$1"; fi
}

already_applied() {  # <series>
    if [ $is_git = 1 ]; then check_git "$1" --reverse; else check_plain "$1" --reverse; fi
}

explain_nothing_fits() {
    if [ "$project" = verl ]; then
        {
            echo "apply.sh: no patch series fits '$dir'."
            echo "  It looks like a verl tree${verl_version:+ at version $verl_version}."
            echo
            echo "Supported verl releases:"
            for s in $(supported_series); do
                printf '  %-9s %s\n' "$s" "$(describe_series "$s")"
            done
            echo
            echo "Get a supported release's source and run this script on it, for example:"
            echo "  pip download --no-deps --no-binary :all: verl==0.9.1 -d /tmp/verl-src"
            echo "  tar xzf /tmp/verl-src/verl-0.9.1.tar.gz -C /tmp/verl-src"
            echo "  bash $here/apply.sh /tmp/verl-src/verl-0.9.1"
            echo "(or 'git checkout v0.9.1' in a clean verl clone)."
        } >&2
        return
    fi
    {
        echo "apply.sh: no patch series fits '$dir'."
        if [ ! -d "$dir/mindspeed_rl" ]; then
            echo "  It does not look like a MindSpeed-RL tree (no mindspeed_rl/ package there)."
        fi
        if [ -n "$head" ]; then
            echo "  It is a git checkout at $head."
        fi
        echo
        echo "Supported upstream commits (Ascend MindSpeed-RL):"
        for s in $(supported_series); do
            printf '  %-9s %s\n' "$s" "$(describe_series "$s")"
        done
        echo "Supported verl releases (a tree with verl/version/version): $(supported_series "$verl_root" | tr '\n' ' ')"
        echo
        echo "Check out one of them and run this script again, for example:"
        echo "  git -C <your MindSpeed-RL clone> fetch origin"
        echo "  git -C <your MindSpeed-RL clone> worktree add /tmp/mindspeed-rl-05a90d7 05a90d7"
        echo "  bash $here/apply.sh /tmp/mindspeed-rl-05a90d7"
        echo "(or 'git checkout 7466375' / 'git checkout 05a90d7' in a clean clone)."
        echo "A tree with local edits to the patched files may not fit; stash them first."
    } >&2
}

# ------------------------------------------------------------------ choose

chosen=""
how=""
if [ -n "$forced" ]; then
    chosen="$forced"; how="--series"
elif [ "$project" = verl ]; then
    for s in $(supported_series); do
        [ "$verl_version" = "$s" ] && { chosen="$s"; how="verl version $verl_version"; }
    done
elif [ -n "$head" ]; then
    for s in $(supported_series); do
        case "$head" in "$s"*) chosen="$s"; how="commit id $head" ;; esac
    done
fi

# an applied series also "fits" a 3-way dry run, so look for that first
if [ -n "$chosen" ]; then
    if already_applied "$chosen"; then
        echo "apply.sh: series $chosen is already applied to $dir"
        exit 0
    fi
    if ! fits "$chosen"; then
        echo "apply.sh: series $chosen (by $how) does not apply cleanly to $dir" >&2
        explain_nothing_fits
        exit 1
    fi
else
    for s in $(supported_series); do
        if already_applied "$s"; then
            echo "apply.sh: series $s is already applied to $dir"
            exit 0
        fi
    done
    for s in $(supported_series); do
        if fits "$s"; then chosen="$s"; how="dry run"; break; fi
    done
    if [ -z "$chosen" ]; then
        explain_nothing_fits
        exit 1
    fi
fi

echo "apply.sh: $project series $chosen fits $dir (chosen by $how)"
for p in $(patches_of "$chosen"); do echo "  $(basename "$p")"; done

if [ $check_only = 1 ]; then
    echo "apply.sh: --check: nothing changed"
    exit 0
fi

# ------------------------------------------------------------------ apply

if [ $is_git = 1 ]; then
    # a clean tree takes the series as it is; local edits go through a 3-way merge
    # shellcheck disable=SC2046
    if git -C "$dir" apply --index $(patches_of "$chosen") 2>/dev/null; then
        mode="git apply --index"
    elif git -C "$dir" apply --3way $(patches_of "$chosen"); then
        mode="git apply --3way"
    else
        echo "apply.sh: git apply --3way failed; resolve the conflicts above or reset the tree" >&2
        exit 1
    fi
    echo "apply.sh: applied with $mode (changes are staged: git -C $dir diff --cached --stat)"
    exit 0
fi

if [ $have_patch = 0 ]; then
    # shellcheck disable=SC2046
    plain_git apply $(patches_of "$chosen") || { echo "apply.sh: git apply failed" >&2; exit 1; }
    echo "apply.sh: applied with git apply"
    exit 0
fi

n=0
skipped_binary=0
for p in $(patches_of "$chosen"); do
    n=$((n + 1))
    split_patch "$p" "$tmp/t$n" "$tmp/b$n"
    patch -p1 -N -t -s -d "$dir" < "$tmp/t$n" || { echo "apply.sh: patch -p1 failed on $(basename "$p")" >&2; exit 1; }
    if [ -s "$tmp/b$n" ]; then
        if [ $have_git = 1 ]; then
            plain_git apply "$tmp/b$n" || { echo "apply.sh: binary part of $(basename "$p") failed" >&2; exit 1; }
        else
            skipped_binary=1
        fi
    fi
done
echo "apply.sh: applied with patch -p1"
if [ $skipped_binary = 1 ]; then
    echo "apply.sh: git is not installed, so the binary figure (dp_balance.png) was not added" >&2
fi
exit 0
