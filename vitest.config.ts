import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Safety nets only (tests wait on states): a loaded machine starts Python with torch, or a
    // set of processes, in tens of seconds.
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Two cores in CI: keep worker count small so timing-sensitive suites are not starved.
    maxWorkers: 2,
  },
});
