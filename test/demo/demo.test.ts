import { describe, expect, it } from "vitest";
import { runCli } from "../helpers/cli.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";

describe("monkeytree demo", () => {
  it(
    "runs controller, daemons and jobs as processes, swaps workers of running jobs, and every job ends bit-identical",
    async () => {
      // The demo's --timeout bounds each of its waits (processes starting, the first plan).
      const { code, stdout, stderr } = await runCli("demo", "--state-mb", "4", "--steps", "40", "--step-ms", "60", "--timeout", String(SAFETY_NET_MS / 1000));
      expect(stderr).toBe("");
      expect(code).toBe(0);
      // gpt's arrival takes racks 0 and 1 to 16 rings on 8 uplinks; no host is free, so the plan swaps.
      expect(stdout).toMatch(/rings\s+16!\s+16!\s+0\s+8/);
      expect(stdout).toMatch(/plan: 2 moves in one step/);
      // The jobs wait before iteration 40/3 until their moves' replacements are ready and the
      // controller told them where to stop, so every move stops its job before it ends.
      const barriers = [...stdout.matchAll(/→ pausing at barrier (\d+)/g)].map((m) => Number(m[1]));
      expect(barriers).toHaveLength(2);
      for (const barrier of barriers) expect(barrier).toBeLessThan(40);
      expect(stdout.match(/^ {2}p0\/\d .* done$/gm)).toHaveLength(2);
      for (const job of ["llama", "mixtral", "gpt"]) expect(stdout).toMatch(new RegExp(`^ {2}${job} .* bit-identical`, "m"));
      expect(stdout.match(/replacement on host \d: loaded the checkpoint/g)).toHaveLength(2);
      expect(stdout).toMatch(/^ok: every move committed/m);
    },
    3 * SAFETY_NET_MS,
  );

  it("rejects bad flags with exit code 2", async () => {
    expect(await runCli("demo", "--steps", "1")).toMatchObject({ code: 2, stderr: expect.stringContaining(`--steps must be a whole number ≥ 2, got "1"`) });
  });
});
