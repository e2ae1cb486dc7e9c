/* ggml-bridge-server: the body of a CPU variant left out of GGML_BRIDGE_CPU_VARIANTS (never installed) */
typedef int ggml_bridge_server_unused_cpu_variant;
