import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SimulationReportSchema, type SimulationReport } from "../../controller/simulator/index.ts";
import { runCli } from "../helpers/cli.ts";
import { canRun, slurm } from "../helpers/prerequisites.ts";
import { startSlurm, type SlurmCluster } from "../helpers/slurm.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";

// A sweep of two runs as a job array on a real slurmctld and two slurmd, merged by a third job.
const runs = canRun("the simulator's Slurm job array", slurm());

describe.runIf(runs)("monkeytree simulate --slurm-array against a real Slurm", { timeout: 3 * SAFETY_NET_MS }, () => {
  let cluster: SlurmCluster;
  const dir = mkdtempSync(join(tmpdir(), "monkeytree-array-"));
  const saved = { SLURM_CONF: process.env.SLURM_CONF, PATH: process.env.PATH };

  beforeAll(async () => {
    cluster = await startSlurm({ nodes: 2, racks: 1 });
    // sbatch, which the command runs in this process, finds the test's Slurm by its environment.
    Object.assign(process.env, { SLURM_CONF: cluster.env.SLURM_CONF, PATH: cluster.env.PATH });
  }, 3 * SAFETY_NET_MS);
  afterAll(() => {
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
    cluster?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const sweep = ["--preset", "fig-threshold", "--jobs", "60", "--variants", "lambda-2,lambda-4"];
  const withoutTimes = (r: SimulationReport) => r.systems.map(({ solver: _, ...rest }) => rest);

  it("runs a task per variant, merges them once all succeeded, and gets what one process running the sweep gets", async () => {
    const out = join(dir, "sweep");
    const submitted = await runCli("simulate", ...sweep, "--slurm-array", out);
    expect(submitted.stderr).toBe("");
    expect(submitted.stdout).toMatch(/^submitted 2 runs as job array \d+ \(.*array\.sh\), merged by job \d+ into /);
    const merged = join(out, "merged.json");
    const text = await cluster.until("the merge job's report", () => existsSync(join(out, "report", "index.html")) && readFileSync(merged, "utf8"));
    const reports = (JSON.parse(text) as unknown[]).map((r) => SimulationReportSchema.parse(r));
    expect(reports).toHaveLength(1);
    const direct = await runCli("simulate", ...sweep, "--json");
    expect(withoutTimes(reports[0]!)).toEqual(withoutTimes(SimulationReportSchema.parse(JSON.parse(direct.stdout))));
    expect(readFileSync(join(out, "report", "index.html"), "utf8")).toContain("p99 at λ = 4");
  });
});
