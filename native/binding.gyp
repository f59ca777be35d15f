{
  "variables": {
    # 1 when <infiniband/verbs.h> and libibverbs are usable (Debian: libibverbs-dev), probed at
    # configure time by compiling and linking a two-line program; 0 builds without RDMA instead
    # of failing. Override with `node-gyp rebuild -- -Dmonkeytree_ibverbs=0`.
    "monkeytree_ibverbs%": "<!(printf '#include <infiniband/verbs.h>\\nint main() { ibv_free_device_list(ibv_get_device_list(0)); }\\n' | ${CXX:-c++} -x c++ - -libverbs -o /dev/null >/dev/null 2>&1 && echo 1 || echo 0)"
  },
  "targets": [
    {
      "target_name": "monkeytree_native",
      "sources": [
        "src/addon.cpp",
        "src/capabilities.cpp",
        "src/copy_worker.cpp",
        "src/crc32c.cpp",
        "src/errors.cpp",
        "src/listener.cpp",
        "src/net.cpp",
        "src/outgoing_transfer.cpp",
        "src/region.cpp",
        "src/staging_buffer.cpp",
        "src/token.cpp"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_DISABLE_CPP_EXCEPTIONS", "NODE_ADDON_API_DISABLE_DEPRECATED"],
      "cflags_cc": ["-std=c++17", "-O2", "-Wall", "-Wextra", "-fvisibility=hidden"],
      "cflags_cc!": ["-fno-exceptions", "-std=gnu++17"],
      "libraries": ["-ldl", "-lpthread"],
      "conditions": [
        ["monkeytree_ibverbs==1",
          {"sources": ["src/rdma.cpp"], "defines": ["MONKEYTREE_HAVE_IBVERBS"], "libraries": ["-libverbs"]},
          {"sources": ["src/rdma_stub.cpp"]}]
      ]
    },
    {
      # The same CRC32C for the Python hook, which loads it with ctypes (node-gyp names every
      # module .node; this one is a plain shared library with two C functions and no Node API).
      "target_name": "monkeytree_crc32c",
      "type": "loadable_module",
      "sources": ["src/crc32c.cpp", "src/crc32c_c_api.cpp"],
      "cflags_cc": ["-std=c++17", "-O2", "-Wall", "-Wextra", "-fvisibility=hidden"],
      "cflags_cc!": ["-fno-exceptions", "-std=gnu++17"]
    }
  ]
}
