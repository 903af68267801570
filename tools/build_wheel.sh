#!/usr/bin/env bash
# Build a CPU wheel of upstream PyTorch with the semiring patch series
# (patches/pytorch/*.patch) applied, or only check that the series applies.
#
# Expected cost of a build (not --check): a from-source CPU build of PyTorch
# takes roughly 1-2 h on 32 cores / 64 GB RAM and several hours on 8 cores
# (upstream's estimate, not measured here); it needs ~30 GB of disk for the
# checkout and build tree. It was NOT run on the 2-core machines this project
# is developed on. What runs instead, in CI, is `make patch-check`
# (tools/patch_check/run.py): the series applied to the pre-image fixture, its
# patched and new translation units compiled against the installed wheel's
# headers and the patched engine run preloaded into the wheel (see
# patches/README.md for what that proves and what only a full build can).
#
# Default revision: the installed 2.13.0 wheel's own (torch.version.git_version
# cf30153c), the headers and torch/autograd/*.py the series is checked against.
# Its C++ hunks were checked against the pre-image fixture, whose engine
# sources come from a later upstream snapshot (patches/pytorch/BASE); at
# cf30153c their context may have moved, and `git am -3` falls back to a
# three-way merge on the blobs the index lines name when they are in the
# checkout's history.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
patch_dir="$here/patches/pytorch"
default_ref="cf30153c4c131c8164ee7798e5022d810682e2cb"  # torch 2.13.0's git_version

usage() {
  cat <<USAGE
usage: tools/build_wheel.sh [options]

Apply patches/pytorch/*.patch (in order) to upstream PyTorch and build a CPU
wheel.

  --src DIR        existing pytorch/pytorch checkout (default: clone into
                   ./build/pytorch); it must have no local changes
  --ref REF        commit, tag or branch to check out (default: $default_ref)
  --no-checkout    use DIR as it is (no fetch, no checkout; for a tree without
                   network access or with no git history of its own)
  --dist DIR       where the wheel goes (default: ./dist)
  --jobs N         MAX_JOBS for the build (default: number of CPUs)
  --check          only verify that the series applies (git apply --check,
                   patch by patch, each on top of the previous); build nothing
  --preimage DIR   with --check: git am the series onto a copy of DIR, a
                   tree that holds only the patched files (the fixture
                   ../shared/pytorch-preimage), with the installed wheel's own
                   torch/autograd/*.py, and check every index line
                   (tools/patch_check/run.py --apply-only); needs no checkout
                   and no network
  -h, --help       this text

Examples:
  tools/build_wheel.sh --check --preimage ../shared/pytorch-preimage
  tools/build_wheel.sh --check --src ~/pytorch --ref v2.13.0
  tools/build_wheel.sh --src ~/pytorch --ref main --dist dist
USAGE
}

src=""
ref="$default_ref"
checkout=1
dist="$PWD/dist"
jobs="$(nproc 2>/dev/null || echo 4)"
check=0
preimage=""

while [[ $# -gt 0 ]]; do
  case "$1" in
    --src) src="$2"; shift 2 ;;
    --ref) ref="$2"; shift 2 ;;
    --no-checkout) checkout=0; shift ;;
    --dist) dist="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --check) check=1; shift ;;
    --preimage) preimage="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done

shopt -s nullglob
patches=("$patch_dir"/[0-9][0-9][0-9][0-9]-*.patch)
shopt -u nullglob
if [[ ${#patches[@]} -eq 0 ]]; then
  echo "no patches in $patch_dir" >&2
  exit 1
fi

# Check that each patch applies on top of the ones before it, without
# touching DIR: a throw-away worktree-free copy of the index is used.
check_series() {
  local tree="$1" scratch
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' RETURN
  cp -a "$tree/." "$scratch/"
  local p
  for p in "${patches[@]}"; do
    if git -C "$scratch" apply --check "$p"; then
      echo "applies: $(basename "$p")"
      git -C "$scratch" apply "$p"
    else
      echo "DOES NOT APPLY: $(basename "$p")" >&2
      return 1
    fi
  done
  echo "the series (${#patches[@]} patches) applies cleanly"
}

if [[ $check -eq 1 && -n "$preimage" ]]; then
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  python "$here/tools/patch_check/run.py" --apply-only --preimage "$preimage" --build "$scratch"
  exit $?
fi

if [[ -z "$src" ]]; then
  src="$PWD/build/pytorch"
  if [[ ! -d "$src/.git" ]]; then
    git clone https://github.com/pytorch/pytorch.git "$src"
  fi
fi
[[ -d "$src" ]] || { echo "no such directory: $src" >&2; exit 1; }

if [[ $checkout -eq 1 ]]; then
  if [[ -n "$(git -C "$src" status --porcelain --untracked-files=no)" ]]; then
    echo "$src has local changes; commit or discard them first" >&2
    exit 1
  fi
  git -C "$src" fetch origin "$ref" || true
  git -C "$src" checkout -q "$ref" 2>/dev/null || git -C "$src" checkout -q FETCH_HEAD
  echo "checked out $(git -C "$src" rev-parse HEAD)"
fi

if [[ $check -eq 1 ]]; then
  check_series "$src"
  exit 0
fi

# git am keeps the series as commits; -3 falls back to a three-way merge
# where the context moved since the revision the hunks were written against.
git -C "$src" -c user.name=build_wheel -c user.email=build_wheel@localhost \
  am -3 "${patches[@]}"
git -C "$src" submodule sync --recursive
git -C "$src" submodule update --init --recursive

mkdir -p "$dist"
(
  cd "$src"
  python -m pip install -r requirements.txt
  # A CPU-only wheel without tests or distributed support; see the build
  # section of the upstream README.md / CONTRIBUTING.md at this ref.
  export USE_CUDA=0 USE_ROCM=0 USE_XPU=0 USE_MPS=0 \
         USE_DISTRIBUTED=0 BUILD_TEST=0 USE_KINETO=0 \
         MAX_JOBS="$jobs"
  python -m pip wheel --no-build-isolation --no-deps -v -w "$dist" .
)

wheel="$(ls -t "$dist"/torch-*.whl | head -n 1)"
cat <<DONE

Built $wheel

Install it into a fresh virtual environment and run the tests:

  python -m venv .venv-patched && . .venv-patched/bin/activate
  pip install "$wheel" numpy pytest expecttest hypothesis
  python $src/test/test_autograd_semiring.py            # patch 4, API surface
  pip install -e $here                                   # torch-semiring on the patched torch
  python $src/test/test_autograd_semiring.py            # now also the library-backed tests
  python -m pytest $here/tests/test_preload.py           # the hook semantics, as on the stock wheel
DONE
