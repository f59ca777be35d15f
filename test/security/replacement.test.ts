import { describe, expect, it } from "vitest";
import { parseReplacements, resolveTenant } from "../../controller/daemon/replacements.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import type { RequestBody } from "../../sdk/client/connection.ts";
import { runCli } from "../helpers/cli.ts";
import { startController } from "../service/harness.ts";

/**
 * A made-up job must not be able to make a daemon run a command of its choosing. No
 * command line crosses the network: a job only names one of the commands a daemon's operator
 * configured (test/service/daemon.test.ts moves jobs naming configured, unconfigured and
 * root-only ones), and what a replacement runs as is the daemon's host's decision.
 */

describe("no command line crosses the network", () => {
  it("refuses a worker.register that carries a command line, naming the field", async () => {
    const harness = await startController();
    const client = new ControllerClient({ endpoint: harness.server.endpoint, timeoutMs: 5_000 });
    try {
      const register = {
        type: "worker.register",
        worker: { job: "evil", group: 0, host: 0 },
        parallelism: { tp: 1, pp: 1, dp: 2 },
        checkpointBytes: 0,
      } as const;
      // The attacker's message, which no schema of ours lets a client write.
      const forged = { ...register, launch: ["/bin/sh", "-c", "touch /tmp/owned"] } as unknown as RequestBody;
      await expect(client.request(forged)).rejects.toMatchObject({ name: "ControllerError", message: expect.stringContaining(`unknown field "launch"`) });
      await expect(client.request({ ...register, replacement: "/bin/sh -c touch" })).rejects.toMatchObject({
        name: "ControllerError",
        message: expect.stringContaining("a replacement name is 1 to 64 of a-z, 0-9"),
      });
      expect((await client.status()).jobs).toEqual([]);
    } finally {
      await client.close();
      await harness.close();
    }
  });
});

describe("a daemon's replacement settings", () => {
  it("takes named commands, refusing bad names, empty commands and repeats", () => {
    expect([...parseReplacements(["train=monkeytree launch -- torchrun t.py", "demo.v2=a=b"])]).toEqual([
      ["train", "monkeytree launch -- torchrun t.py"],
      ["demo.v2", "a=b"],
    ]);
    expect(() => parseReplacements(["Train=x"])).toThrow(`--replacement "Train=x": a replacement name is 1 to 64 of a-z, 0-9`);
    expect(() => parseReplacements(["train"])).toThrow("--replacement train has no command: give it as --replacement train=COMMAND");
    expect(() => parseReplacements(["t=a", "t=b"])).toThrow("--replacement t is given twice");
  });

  it("runs replacements as no unknown user and never as root", () => {
    expect(() => resolveTenant("monkeytree-no-such-user")).toThrow("--run-as monkeytree-no-such-user: no such user on this host");
    expect(() => resolveTenant("root")).toThrow("--run-as root is root (uid 0): replacements run tenants' code, so name an unprivileged user");
  });

  it("exits 2 naming the flag when the daemon's replacement settings are wrong", async () => {
    expect(await runCli("daemon", "--host", "0", "--replacement", "Bad Name=x")).toMatchObject({
      code: 2,
      stderr: expect.stringContaining(`--replacement "Bad Name=x": a replacement name`),
    });
    expect(await runCli("daemon", "--host", "0", "--run-as", "root")).toMatchObject({
      code: 2,
      stderr: expect.stringContaining("--run-as root is root (uid 0)"),
    });
    expect(await runCli("launch", "--job", "j", "--host", "0", "--dp", "1", "--replacement", "../x", "--", "torchrun", "t.py")).toMatchObject({
      code: 2,
      stderr: expect.stringContaining(`--replacement "../x": a replacement name`),
    });
  });
});
