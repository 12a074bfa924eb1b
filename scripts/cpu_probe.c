/* Which CPU instruction sets can this machine really execute?
 *
 * /proc/cpuinfo and CPUID say what the processor has, not what the operating system (or the
 * hypervisor) enabled: a VM once listed amx_tile while its hypervisor left AMX tile state off,
 * and llama.cpp built with -march=native died with SIGILL on `tilezero`.  So each feature is
 * tested by executing one of its instructions: `cpu_probe FEATURE` exits 0 when the instruction
 * ran, and dies of SIGILL (or exits 2) when it did not.  scripts/build_llama.py runs it once per
 * feature, each in its own process, and builds llama.cpp only with the features that ran.
 *
 * Built with plain `cc -O0 cpu_probe.c`: the instructions are in inline assembly, so no -m flag
 * is needed and the compiler never emits them elsewhere.
 */
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx(void) {
    /* Linux hands out AMX tile state only on request; a refusal means it is not usable. */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 2;
    unsigned char cfg[64];
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;        /* palette 1 */
    cfg[16] = 64;      /* tile 0: 64 bytes per row */
    cfg[48] = 16;      /* tile 0: 16 rows */
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
    __asm__ volatile("tilezero %%tmm0" ::: "memory");
    __asm__ volatile("tilerelease" ::: "memory");
    return 0;
}

static int run(const char *f) {
    if (!strcmp(f, "sse42")) { unsigned c = 0; __asm__ volatile("crc32l %1, %0" : "+r"(c) : "r"(1u)); return 0; }
    if (!strcmp(f, "avx")) { __asm__ volatile("vxorps %%ymm0, %%ymm0, %%ymm0" ::: "xmm0"); return 0; }
    if (!strcmp(f, "avx2")) { __asm__ volatile("vpaddd %%ymm0, %%ymm0, %%ymm0" ::: "xmm0"); return 0; }
    if (!strcmp(f, "fma")) { __asm__ volatile("vfmadd231ps %%ymm0, %%ymm0, %%ymm0" ::: "xmm0"); return 0; }
    if (!strcmp(f, "f16c")) { __asm__ volatile("vcvtph2ps %%xmm0, %%ymm0" ::: "xmm0"); return 0; }
    if (!strcmp(f, "bmi2")) { unsigned a = 5, b = 3, r; __asm__ volatile("pdep %2, %1, %0" : "=r"(r) : "r"(a), "r"(b)); return 0; }
    if (!strcmp(f, "avx_vnni")) { __asm__ volatile("%{vex%} vpdpbusd %%ymm0, %%ymm0, %%ymm0" ::: "xmm0"); return 0; }
    /* ggml's GGML_AVX512 means -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw: test all five. */
    if (!strcmp(f, "avx512")) {
        __asm__ volatile("vpaddd %%zmm0, %%zmm0, %%zmm0" ::: "xmm0");            /* F  */
        __asm__ volatile("vplzcntd %%zmm0, %%zmm0" ::: "xmm0");                  /* CD */
        __asm__ volatile("vpabsq %%ymm0, %%ymm0" ::: "xmm0");                   /* VL: EVEX-only on ymm */
        __asm__ volatile("vpmullq %%zmm0, %%zmm0, %%zmm0" ::: "xmm0");           /* DQ */
        __asm__ volatile("vpaddb %%zmm0, %%zmm0, %%zmm0" ::: "xmm0");            /* BW */
        return 0;
    }
    if (!strcmp(f, "avx512_vbmi")) { __asm__ volatile("vpermb %%zmm0, %%zmm0, %%zmm0" ::: "xmm0"); return 0; }
    if (!strcmp(f, "avx512_vnni")) { __asm__ volatile("vpdpbusd %%zmm0, %%zmm0, %%zmm0" ::: "xmm0"); return 0; }
    if (!strcmp(f, "avx512_bf16")) { __asm__ volatile("vdpbf16ps %%zmm0, %%zmm0, %%zmm0" ::: "xmm0"); return 0; }
    if (!strcmp(f, "amx")) return amx();
    return 3;
}
#elif defined(__aarch64__)
/* Encoded as .inst words so that the probe builds with any -march. */
static int run(const char *f) {
    if (!strcmp(f, "dotprod")) { __asm__ volatile(".inst 0x4e809400" ::: "v0"); return 0; }  /* sdot v0.4s, v0.16b, v0.16b */
    if (!strcmp(f, "fp16")) { __asm__ volatile(".inst 0x4e401400" ::: "v0"); return 0; }     /* fadd v0.8h, v0.8h, v0.8h */
    if (!strcmp(f, "i8mm")) { __asm__ volatile(".inst 0x4e80a400" ::: "v0"); return 0; }     /* smmla v0.4s, v0.16b, v0.16b */
    return 3;
}
#else
static int run(const char *f) { (void)f; return 3; }
#endif

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: cpu_probe FEATURE\n");
        return 64;
    }
    return run(argv[1]);
}
