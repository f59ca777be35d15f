import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { MAX_GPUS_PER_HOST, MAX_HOSTS, MAX_HOSTS_PER_RACK, MAX_RACKS, MAX_UPLINKS_PER_RACK } from "../../sdk/contract/protocol/limits.ts";
import { runCli, type CliResult } from "../helpers/cli.ts";

/**
 * `monkeytree plan` and `routes` over snapshots generated from the schema, huge and
 * adversarial values included. Whatever the snapshot, the answer is exit 0, 1 or 2 with a
 * one-line reason, never a stack trace, an internal error or an abort, within a bounded time.
 */

const dir = mkdtempSync(join(tmpdir(), "monkeytree-cli-fuzz-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Numbers at and around every limit, and far past them. */
const edgeNumbers = [
  0,
  -1,
  1,
  2,
  1.5,
  MAX_RACKS,
  MAX_RACKS + 1,
  MAX_HOSTS_PER_RACK + 1,
  MAX_GPUS_PER_HOST + 1,
  MAX_UPLINKS_PER_RACK + 1,
  MAX_HOSTS,
  65_536,
  1e7,
  2 ** 31,
  2 ** 53 - 1,
  2 ** 53,
  1e308,
  -1e308,
];
const number = fc.oneof(
  { weight: 4, arbitrary: fc.integer({ min: 1, max: 8 }) },
  { weight: 2, arbitrary: fc.constantFrom(...edgeNumbers) },
  { weight: 1, arbitrary: fc.double({ noNaN: true }) },
);

/** Anything JSON can hold, nested a few levels: what a wrong type looks like. */
const junk = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    fc.constant(null),
    fc.boolean(),
    number,
    fc.string({ maxLength: 8 }),
    fc.array(tie("value"), { maxLength: 3 }),
    fc.dictionary(fc.string({ maxLength: 4 }), tie("value"), { maxKeys: 3 }),
  ),
})).value;

/** Mostly the right type, sometimes anything. */
const field = <T>(arbitrary: fc.Arbitrary<T>) => fc.oneof({ weight: 6, arbitrary }, { weight: 1, arbitrary: junk });

const id = fc.oneof(
  fc.string({ minLength: 1, maxLength: 6 }),
  fc.string({ unit: "binary", maxLength: 20 }),
  fc.constantFrom("a\n[controller] forged", "\u001b[2J", "x".repeat(10_000)),
);
const hosts = fc.array(field(number), { maxLength: 8 });

const job = fc.record(
  {
    id: field(id),
    rings: field(number),
    hosts: field(hosts),
    groups: field(fc.array(hosts, { maxLength: 3 })),
    extra: junk,
  },
  { requiredKeys: ["id"] },
);

const adversarial = fc.record(
  {
    topology: field(
      fc.record(
        { racks: field(number), hostsPerRack: field(number), gpusPerHost: field(number), uplinksPerRack: field(number), racksPerPod: field(number) },
        { requiredKeys: ["racks", "hostsPerRack", "gpusPerHost", "uplinksPerRack"] },
      ),
    ),
    lambda: field(number),
    podLambda: field(number),
    jobs: field(fc.array(job, { maxLength: 6 })),
  },
  { requiredKeys: ["topology", "jobs"] },
);

/** Snapshots the schema accepts, small enough to plan at once: the paths past validation. */
const valid = fc
  .record({ racks: fc.integer({ min: 1, max: 8 }), hostsPerRack: fc.integer({ min: 1, max: 8 }), uplinksPerRack: fc.integer({ min: 1, max: 4 }) })
  .chain((t) =>
    fc.record({
      topology: fc.constant({ ...t, gpusPerHost: 8 }),
      lambda: fc.integer({ min: 0, max: 4 }),
      used: fc.shuffledSubarray(Array.from({ length: t.racks * t.hostsPerRack }, (_, h) => h)),
      sizes: fc.array(fc.integer({ min: 1, max: 4 }), { maxLength: 8 }),
      rings: fc.integer({ min: 1, max: MAX_GPUS_PER_HOST }),
    }),
  )
  .map(({ topology, lambda, used, sizes, rings }) => {
    const jobs = [];
    for (const [j, size] of sizes.entries()) {
      const hosts = used.splice(0, size);
      if (hosts.length) jobs.push({ id: `job-${j}`, rings, hosts });
    }
    return { topology, lambda, jobs };
  });

const snapshot = fc.oneof(valid, adversarial);

/** What every run must look like, whatever the input. */
function expectClean(result: Pick<CliResult, "code" | "stderr">): void {
  expect([0, 1, 2]).toContain(result.code);
  expect(result.stderr).not.toMatch(/^\s+at /m);
  expect(result.stderr).not.toContain("internal error");
}

let written = 0;
function write(text: string): string {
  const path = join(dir, `s${written++}.json`);
  writeFileSync(path, text);
  return path;
}

/** Per case: generous for a loaded 2-core machine, far below what an unbounded loop takes. */
const CASE_MS = 10_000;

describe("CLI fuzz over the snapshot schema", () => {
  it("plan and routes answer every generated snapshot with exit 0, 1 or 2", async () => {
    await fc.assert(
      fc.asyncProperty(snapshot, async (value) => {
        const path = write(JSON.stringify(value));
        for (const argv of [
          ["plan", "--snapshot", path, "--time-limit", "0.2"],
          ["routes", "--snapshot", path],
        ]) {
          const started = performance.now();
          expectClean(await runCli(...argv));
          expect(performance.now() - started).toBeLessThan(CASE_MS);
        }
      }),
      { numRuns: 300 },
    );
  }, 120_000);

  const binary = join(import.meta.dirname, "../../dist/cli/monkeytree.js");
  /** Snapshots that once aborted the process, run by the built binary with a small heap. */
  const killers: Record<string, string> = {
    "2^53 racks": JSON.stringify({ topology: { racks: 2 ** 53, hostsPerRack: 1, gpusPerHost: 8, uplinksPerRack: 1 }, jobs: [] }),
    "10^7 hosts per rack": JSON.stringify({ topology: { racks: 4, hostsPerRack: 1e7, gpusPerHost: 8, uplinksPerRack: 4 }, jobs: [] }),
    "65,536 racks": JSON.stringify({ topology: { racks: 65_536, hostsPerRack: 1, gpusPerHost: 8, uplinksPerRack: 1 }, jobs: [] }),
    "10^7 uplinks": JSON.stringify({ topology: { racks: 4, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 1e7 }, jobs: [] }),
    "a million bad hosts": JSON.stringify({
      topology: { racks: 2, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 },
      jobs: [{ id: "a", hosts: new Array(1_000_000).fill(-1) }],
    }),
    "arrays nested 100,000 deep": `{"topology":${"[".repeat(100_000)}${"]".repeat(100_000)},"jobs":[]}`,
    "the largest topology, full": JSON.stringify({
      topology: { racks: MAX_RACKS, hostsPerRack: MAX_HOSTS / MAX_RACKS, gpusPerHost: MAX_GPUS_PER_HOST, uplinksPerRack: 1 },
      lambda: 1,
      jobs: Array.from({ length: MAX_HOSTS / 2 }, (_, i) => ({ id: `j${i}`, hosts: [i, MAX_HOSTS - 1 - i] })),
    }),
  };

  it.each(Object.keys(killers))(
    "the built binary survives %s with a 512 MB heap",
    (name) => {
      expect(existsSync(binary), "dist/ is not built; run `npm run build`").toBe(true);
      const path = write(killers[name]!);
      for (const command of ["plan", "routes"]) {
        const extra = command === "plan" ? ["--time-limit", "0.5"] : [];
        const result = spawnSync(process.execPath, ["--max-old-space-size=512", "bin/monkeytree.js", command, "--snapshot", path, ...extra], {
          encoding: "utf8",
          timeout: 60_000,
          maxBuffer: 64 * 1024 * 1024,
        });
        expect(result.signal).toBeNull();
        expectClean({ code: result.status ?? -1, stderr: result.stderr });
      }
    },
    150_000,
  );
});

describe("CLI fuzz over controller addresses", () => {
  /** Mostly near misses of a real address: a scheme, a host, a port, each sometimes wrong. */
  const address = fc.oneof(
    fc.string({ maxLength: 40 }),
    fc
      .tuple(
        fc.constantFrom("tcp://", "ipc://", "inproc://", "udp://", "tcp:/", ""),
        fc.constantFrom("127.0.0.1", "[::1]", "*", "", "h h", "a:b", "-", "%", "_h", "h*", "é", "h;127.0.0.1"),
        fc.constantFrom(":1", ":0", ":*", ":65536", ":", "", "/x"),
      )
      .map((parts) => parts.join("")),
  );

  it("status answers any --connect with exit 2 (malformed) or 3 (no answer), in one line", async () => {
    await fc.assert(
      fc.asyncProperty(address, async (value) => {
        const result = await runCli("status", "--connect", value, "--timeout", "0.1");
        expect([2, 3], result.stderr).toContain(result.code);
        expect(result.stderr).not.toMatch(/^\s+at /m);
        expect(result.stderr).not.toContain("internal error");
      }),
      { numRuns: 150 },
    );
  }, 120_000);
});
