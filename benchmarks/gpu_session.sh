#!/usr/bin/env bash
# One GPU session of 15 device minutes (900 s, one H200) for issue 38's open questions: the
# attention path (cuDNN's own dropout against the Pallas kernel), model.dtype=auto in the
# real loop, FP8. Two device calls, run from the repository's root with the ml_collections
# wheel carried (the GPU image lacks it):
#
#   here, once:  mkdir -p .whl && cp ../shared/wheels/ml_collections-*.whl .whl/
#                (.gitignore ignores /.whl/; `carry` sends it)
#   call 1:      run(command="bash benchmarks/gpu_session.sh 1", carry=[".whl"], timeout_s=450)
#   call 2:      run(command="bash benchmarks/gpu_session.sh 2", carry=[".whl"], timeout_s=480)
#                at once after call 1 (the machine stays warm 30 s), then give_back.
#
# Budget (seconds of device time; rows from benchmarks/RESULTS.md's H200 runs, guesses
# marked ~): machine start and transfers ~120; call 1 ~365 (setup 10, attention_masks ~35,
# attention_sweep 90, suite call 1: probe ~10, kernel check 60, base128 65 traced,
# base128 attention=cudnn ~60, table 10 = ~230); call 2 ~390 (setup 5, suite call 2:
# probe ~10, large128 115, large128 FP8 115 = ~250; train.py ~75: start, init and a 40 s
# compile, 60 steps; pytest ~60: the FP8 tests not marked slow); idle
# between the calls ~20: about 895 of 900. Every step has its own limit (`timeout`, the
# suite's --deadline_s, the sweep's), so a slow step costs its own rows; the calls run
# the steps most needed first; each call's timeout_s covers its steps' limits, and where
# the steps run to their limits the session's 900 s cut call 2's last step first. What
# each must show: benchmarks/RESULTS.md, "First GPU run: what it must show".
#
# Under $OUT (3 files a call, of the 8 a call brings back): sessionN.log (everything
# printed), summaryN.txt (one line per step: seconds, exit status, the figures that
# decide), filesN.tar.gz (the suite's reports, trace, the sweep's JSON, train.py's
# metrics), rewritten after every step so a call cut short keeps what it had.
# GPU_SESSION_DRY=1 prints the commands and runs none (a check of the plumbing on a CPU).
set -u
PART=${1:?usage: bash benchmarks/gpu_session.sh 1|2}
OUT=${OUT:-/tmp/gpu_session_out}
WORK=${GPU_SESSION_WORK:-/tmp/gpu_session}
DRY=${GPU_SESSION_DRY:-}
mkdir -p "$OUT" "$WORK"
LOG="$OUT/session$PART.log"
SUMMARY="$OUT/summary$PART.txt"
: > "$SUMMARY"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2

note() { echo "$*" | tee -a "$SUMMARY"; }

pack() {  # the bulky files, small enough to come back (16 MiB a file)
  tar czf "$OUT/files$PART.tar.gz" -C "$WORK" --exclude='*.xplane.pb' \
    --exclude='checkpoints' --exclude='tensorboard' . 2>/dev/null || true
}

# step NAME LIMIT_S COMMAND...: runs the command under `timeout`, notes its seconds and exit
# status (124: cut at its limit), and packs the files.
step() {
  local name=$1 limit=$2 t0 rc
  shift 2
  echo "== $(date -u +%H:%M:%S) $name (limit ${limit} s): $*"
  t0=$(date +%s)
  if [ -n "$DRY" ]; then rc=0; else timeout -k 10 "$limit" "$@"; rc=$?; fi
  note "$name: $(( $(date +%s) - t0 )) s, exit $rc"
  pack
  return 0
}

setup() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || note "setup: the wheels did not install"
    export PYTHONPATH="$PWD:/tmp/site"
  else
    export PYTHONPATH="$PWD"
  fi
  [ -n "$DRY" ] && return 0
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
    | sed 's/^/gpu: /' | tee -a "$SUMMARY"
  python3 -c "import jax, flax, optax, torch, transformers, ml_collections; print('versions: jax',
    jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch',
    torch.__version__, 'transformers', transformers.__version__, jax.devices())" \
    | tee -a "$SUMMARY"
}

# Figures that decide, from the files the steps wrote (nothing to read in a dry run).
figures() {
  [ -n "$DRY" ] && return 0
  python3 - "$WORK" "$PART" <<'EOF' | tee -a "$SUMMARY"
import json, pathlib, sys

work, part = pathlib.Path(sys.argv[1]), sys.argv[2]

def rows(name):
    path = work / name / "gpu_suite.json"
    if not path.exists():
        print(f"{name}: no report")
        return {}
    data = json.loads(path.read_text())
    for c in data.get("checks", {}).get("checks", []):
        if "error" in c:
            print(f"{name} kernel check FAILED: {c['path']} {c['dtype']} dropout "
                  f"{c['dropout']}: {c['error']}")
    out = {}
    for r in data["rows"]:
        key = (r["case"], r["kind"], r["variant"])
        out[key] = r
        cell = (f"{r['ms_per_step']:.1f} ms, {r['seq_per_s']:,.0f} seq/s, MFU "
                f"{100 * r.get('mfu', 0):.1f}%, first step {r.get('first_step_s', 0):.0f} s"
                if "ms_per_step" in r else f"ERROR {r.get('error', '?')[:150]}")
        print(f"{name}: {' '.join(key)}: {cell}")
    return out

if part == "1":
    sweep = work / "sweep" / "sweep.txt"
    if sweep.exists():  # auto_rule's verdict, per shape and layout, and the 4 ms target
        text = sweep.read_text()
        verdict = (text.split("== auto_rule", 1)[1].splitlines()[1:]
                   if "== auto_rule" in text else [])
        for line in verdict:
            print(f"sweep: {line}")
    base = rows("suite1")
    pallas = base.get(("base128", "bert_jax", "default"), {}).get("ms_per_step")
    cudnn = base.get(("base128", "bert_jax", "attention=cudnn"), {}).get("ms_per_step")
    if pallas and cudnn:
        gap = abs(pallas - cudnn)
        print(f"base128 whole step: cudnn (own dropout) {cudnn:.1f} ms against pallas "
              f"(hash dropout) {pallas:.1f} ms: {'cudnn' if cudnn < pallas else 'pallas'} "
              f"faster by {gap:.1f} ms ({100 * gap / pallas:.1f}%)")
else:
    large = rows("suite2")
    bf16 = large.get(("large128", "bert_jax", "default"), {}).get("ms_per_step")
    fp8 = large.get(("large128", "bert_jax", "fp8=True"), {}).get("ms_per_step")
    if bf16 and fp8:
        census = large[("large128", "bert_jax", "fp8=True")].get("gemms", {})
        print(f"large128 FP8 {fp8:.1f} ms against bf16 {bf16:.1f} ms: "
              f"{100 * (bf16 - fp8) / bf16:.1f}% faster (the audit predicts 16%); "
              f"{census.get('fp8', '?')} of {census.get('gemms', '?')} GEMMs take FP8 operands")
    metrics = work / "train" / "metrics.jsonl"
    if metrics.exists():
        times = [json.loads(l) for l in metrics.read_text().splitlines()]
        times = [(m["step"], m["perf/step_time"]) for m in times if "perf/step_time" in m]
        if times:
            step, t = times[-1]
            line = f"train.py BERT-Large 256 x 128: {1e3 * t:.1f} ms a step (steps to {step})"
            if bf16:
                gap = 1e3 * t / bf16 - 1
                line += (f", {100 * gap:+.1f}% against the suite's {bf16:.1f} ms: "
                         f"{'PASS' if abs(gap) <= 0.03 else 'FAIL'} (within 3%)")
            print(line)
EOF
}

cd "$(dirname "$0")/.." || exit 1
note "gpu_session part $PART, $(date -u +%Y-%m-%dT%H:%M:%SZ)," \
  "commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
setup

if [ "$PART" = 1 ]; then
  # cuDNN's dropout masks: rate, independence, steps, values (exit 1 if a check fails).
  step attention_masks 60 python3 benchmarks/attention_masks.py
  # The attention candidates alone at one shape per length (the others differ in heads),
  # every candidate before the tilings; its own deadline, then the table and auto_rule.
  step attention_sweep 110 python3 benchmarks/attention_sweep.py --shapes=base128,large512 \
    --deadline_s=80 --out="$WORK/sweep"
  # base128: the default row (Pallas, hash dropout; traced) against attention=cudnn (its
  # own dropout) in the whole step, after the kernel check (masks done above).
  step suite1 250 python3 benchmarks/gpu_suite.py --out="$WORK/suite1" --cases=base128 \
    --variants="base128:attention=cudnn" --compile_cases= --eager_cases= \
    --profile_case=base128 --skip_mask_check --deadline_s=230
elif [ "$PART" = 2 ]; then
  # large128 bf16 (model.dtype=auto) and FP8, no kernel check (call 1 ran it).
  step suite2 270 python3 benchmarks/gpu_suite.py --out="$WORK/suite2" --cases=large128 \
    --variants="large128:fp8=true" --compile_cases= --eager_cases= --profile_case= \
    --skip_check --deadline_s=255
  # The documented command with no dtype flag: bf16 (auto), steady steps 41-60.
  step train_py 100 python3 launch/train.py --config=configs/bert_large.py \
    --workdir="$WORK/train" --config.data.source=synthetic --config.train.steps=60 \
    --config.train.log_every=20 --config.train.eval_every=-1 --config.checkpoint.every=-1
  grep -h "compute .*(model.dtype=" "$LOG" | head -1 | sed 's/^.*pre-training: /train.py: /' \
    | tee -a "$SUMMARY"
  # FP8 on the GPU's FP8 GEMMs: the delayed-scaled product against ml_dtypes, the state,
  # bit-for-bit resume and exports (tests not marked slow); the 300-step FP8-against-bf16
  # test (slow) only where TensorFlow reads the sample's TFRecords (the GPU image has none).
  # Not the slow mesh test: it compares a CPU worker with this process's GPU run.
  fp8_tests=(tests/models/test_fp8.py tests/train/test_fp8.py -m "not slow")
  if [ -z "$DRY" ] && python3 -c "import tensorflow" >/dev/null 2>&1; then
    fp8_tests=(tests/models/test_fp8.py tests/train/test_fp8.py -k "not data_and_fsdp_mesh")
  fi
  step pytest_fp8 90 python3 -m pytest -q -p no:cacheprovider "${fp8_tests[@]}" \
    --junitxml="$WORK/pytest_fp8.xml"
  tail -n 3 "$LOG" | grep -E "passed|failed|error" | sed 's/^/pytest_fp8: /' | tee -a "$SUMMARY"
else
  echo "usage: bash benchmarks/gpu_session.sh 1|2" >&2
  exit 2
fi
figures
pack
note "part $PART done"
exec >&- 2>&-  # let tee write the log's last lines before the call returns
wait "$TEE_PID" 2>/dev/null || sleep 1
