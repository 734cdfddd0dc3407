#!/bin/sh
# Prints the CMAKE_ARGS for building llama-cpp-python on THIS CPU.
# Never GGML_NATIVE: on some VMs the CPU advertises AMX but tile instructions
# fault (SIGILL in ggml_backend_amx_mul_mat), and the GGML_AMX_* switches are
# ignored while GGML_NATIVE is on. So native is off, AMX is off, and each
# x86 extension is switched on only where /proc/cpuinfo lists it.
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has() { case " $flags " in *" $1 "*) return 0 ;; esac; return 1; }
onoff() { if has "$1"; then echo ON; else echo OFF; fi; }
args="-DGGML_NATIVE=OFF"
case "$(uname -m)" in
x86_64|amd64|i?86)
  args="$args -DGGML_AVX=$(onoff avx) -DGGML_AVX2=$(onoff avx2) -DGGML_FMA=$(onoff fma)"
  args="$args -DGGML_F16C=$(onoff f16c) -DGGML_BMI2=$(onoff bmi2)"
  args="$args -DGGML_AVX512=$(onoff avx512f) -DGGML_AVX512_VBMI=$(onoff avx512vbmi)"
  args="$args -DGGML_AVX512_VNNI=$(onoff avx512_vnni) -DGGML_AVX512_BF16=$(onoff avx512_bf16)"
  args="$args -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  ;;
esac
echo "$args"
