import { spawn } from "node:child_process";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { CLI } from "../../cli/paths.ts";
import { runCli } from "../helpers/cli.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";
import { tempDir } from "../service/harness.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

describe("--metrics", () => {
  it("is checked before anything starts, naming the flag", async () => {
    for (const command of [["controller"], ["daemon", "--host", "0"]]) {
      const result = await runCli(...command, "--metrics", "localhost:http");
      expect(result).toMatchObject({ code: 2, stdout: "" });
      expect(result.stderr).toContain('--metrics must be PORT or HOST:PORT with a port in 0..65535, got "localhost:http"');
    }
  });

  it(
    "makes a controller process serve its metrics on loopback until it stops",
    async () => {
      const dir = tempDir();
      dirs.push(dir);
      const child = spawn(process.execPath, [...CLI, "controller", "--bind", "tcp://127.0.0.1:*", "--journal", join(dir, "journal"), "--metrics", "0"], {
        stdio: ["ignore", "pipe", "pipe"],
      });
      const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
      const url = await new Promise<string>((resolve, reject) => {
        createInterface({ input: child.stdout }).on("line", (line) => {
          const match = /^metrics on (http:\/\/127\.0\.0\.1:\d+\/metrics)$/.exec(line);
          if (match) resolve(match[1]!);
        });
        void exited.then((code) => reject(new Error(`the controller exited (${code}) before serving metrics`)));
      });
      const text = await (await fetch(url)).text();
      expect(text).toMatch(/^monkeytree_build_info\{.*role="controller"\} 1$/m);
      expect(text).toMatch(/^monkeytree_rack_fragmentation_bound\{rack="15"\} 8$/m);
      expect(text).toMatch(/^monkeytree_journal_size_bytes [1-9]\d*$/m);
      child.kill("SIGTERM");
      expect(await exited).toBe(0);
      await expect(fetch(url)).rejects.toThrow();
    },
    SAFETY_NET_MS,
  );
});
