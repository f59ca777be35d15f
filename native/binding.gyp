{
  "targets": [
    {
      "target_name": "monkeytree_native",
      "sources": [
        "src/addon.cpp",
        "src/capabilities.cpp",
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
      "libraries": ["-ldl", "-lpthread"]
    }
  ]
}
