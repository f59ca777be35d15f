import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { ProcessGroup } from "../../cli/demo/processes.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function group(): ProcessGroup {
  const dir = mkdtempSync(join(tmpdir(), "monkeytree-processes-"));
  dirs.push(dir);
  return new ProcessGroup(dir);
}

describe("the demo's process group", () => {
  it("quotes the end of a failed process's log in its failure", async () => {
    const processes = group();
    const lines = Array.from({ length: 20 }, (_, i) => `line ${i}`).join("\\n");
    const failing = processes.start("daemon-0", ["-e", `console.error("${lines}\\nwhat went wrong"); process.exit(3)`]);
    expect(await failing.exited).toBe(3);
    expect(processes.failure).toMatch(/^daemon-0 exited \(3\); see \S+daemon-0\.log; it ended with:\n/);
    expect(processes.failure).toContain("    line 19\n    what went wrong");
    expect(processes.failure).not.toContain("line 12\n");
  });

  it("quotes it when a process exits before printing what was waited for", async () => {
    const processes = group();
    const failing = processes.start("controller", ["-e", `console.error("bind: address in use"); process.exit(2)`]);
    await expect(processes.waitFor(failing, /listening/, SAFETY_NET_MS)).rejects.toThrow(
      /exited \(2\) before printing \/listening\/; see .*\n {4}bind: address in use$/,
    );
  });
});
