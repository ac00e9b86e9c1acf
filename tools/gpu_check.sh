#!/usr/bin/env bash
# One prepared run on a GPU machine without a registry (the H200 of shared/STACK-NOTES.md): install the wheels in
# .whl (shared/gpu/fetch-wheels.sh) and this checkout, then kope doctor, tools/device_check.py and pytest -m gpu as
# root, then kope doctor and two GPU tests as an ordinary user. Summaries on stdout, full logs in $OUT (or /tmp).
#   bash tools/gpu_check.sh        (DC_T, PT_T, U_T: each step's time limit in seconds)
# Measured there: ~7 minutes with PT_T=240 (install 10 s, doctor 5 s, device_check 160 s, pytest -m gpu ~4 min).
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)" || exit 1
O=${OUT:-/tmp}
DC_T=${DC_T:-200}; PT_T=${PT_T:-260}; U_T=${U_T:-90}
{
echo "=== install $(date +%T)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -3
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir . 2>&1 | tail -3
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
export KOPE_EMBEDDINGS=off
echo "=== kope doctor $(date +%T)"; timeout 90 python3 -m kope_mcp doctor > "$O/doctor.log" 2>&1; grep -E 'Sandbox|Target|GPU|limits|not avail|MISSING' "$O/doctor.log" | head -20
echo "=== tools/device_check.py $(date +%T)"; KOPE_PROFILE_S=2 timeout "$DC_T" python3 tools/device_check.py > "$O/device-check.log" 2>&1; echo "rc=$?"; cut -c1-400 "$O/device-check.log" | tail -30
echo "=== pytest -m gpu $(date +%T)"; timeout "$PT_T" python3 -m pytest -q -m gpu tests -p no:cacheprovider --timeout 150 -rfE --tb=short > "$O/pytest-gpu.log" 2>&1; echo "rc=$?"; grep -E "passed|failed|^FAILED|^ERROR|Error:|assert" "$O/pytest-gpu.log" | cut -c1-600 | tail -25
echo "=== as an ordinary user $(date +%T)"
id kopeuser >/dev/null 2>&1 || useradd -m kopeuser
rm -rf /tmp/kope-user && cp -r . /tmp/kope-user && chmod -R a+rX /tmp/kope-user && chown -R kopeuser /tmp/kope-user
timeout "$U_T" su kopeuser -s /bin/bash -c "cd /tmp/kope-user && export KOPE_EMBEDDINGS=off PATH=$PATH && python3 -m kope_mcp doctor 2>&1 | grep -E 'Sandbox|GPU run|Target     (cuda|triton)' ; python3 -m pytest -q -p no:cacheprovider --timeout 60 -rfE --tb=short 'tests/e2e/test_gpu_on_device.py::test_the_triton_baseline_runs_and_is_timed_on_the_gpu_at_its_gpu_size' 'tests/e2e/test_gpu_on_device.py::test_a_cuda_fault_is_the_kernels_crash_named_with_its_case' 2>&1 | tail -15" > "$O/as-user.log" 2>&1; echo "rc=$?"; tail -20 "$O/as-user.log" | cut -c1-400
echo "=== end $(date +%T)"
} 2>&1 | tee "$O/gpu-check.log"
