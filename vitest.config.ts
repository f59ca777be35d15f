import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    // Two cores in CI: keep worker count small so timing-sensitive suites are not starved.
    maxWorkers: 2,
  },
});
