import { readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { loadKeyring } from "../../controller/service/keys.ts";
import { readCredential } from "../../sdk/contract/protocol/auth.ts";
import { runCli } from "../helpers/cli.ts";
import { tempDir } from "../service/harness.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

describe("monkeytree keys", () => {
  it("writes the keyring and one owner-only credential per holder, each naming the controller's key and its role", async () => {
    const dir = join(tempDir(), "keys");
    dirs.push(join(dir, ".."));
    const result = await runCli("keys", "--dir", dir, "--daemon", "0-1,5", "--job", "llama", "--operator", "ops");
    expect(result, result.stderr).toMatchObject({ code: 0, stderr: "" });
    const keyring = loadKeyring(dir);
    expect(keyring.clients.map((c) => [c.name, c.principal])).toEqual([
      ["daemon-0", { role: "daemon", host: 0 }],
      ["daemon-1", { role: "daemon", host: 1 }],
      ["daemon-5", { role: "daemon", host: 5 }],
      ["job-llama", { role: "job", job: "llama" }],
      ["operator-ops", { role: "operator" }],
    ]);
    for (const client of keyring.clients) {
      const path = join(dir, `${client.name}.json`);
      expect(statSync(path).mode & 0o777).toBe(0o600);
      expect(readCredential(path)).toMatchObject({ principal: client.principal, publicKey: client.publicKey, serverKey: keyring.publicKey });
    }
    expect(statSync(join(dir, "controller.json")).mode & 0o777).toBe(0o600);
  });

  it("keeps every existing secret when run again, adding only what is missing", async () => {
    const dir = tempDir();
    dirs.push(dir);
    await runCli("keys", "--dir", dir, "--job", "a");
    const before = { keyring: readFileSync(join(dir, "controller.json"), "utf8"), job: readFileSync(join(dir, "job-a.json"), "utf8") };
    const again = await runCli("keys", "--dir", dir, "--job", "a", "--job", "b");
    expect(again.stdout).toContain(`kept ${join(dir, "job-a.json")}: it exists`);
    expect(readFileSync(join(dir, "job-a.json"), "utf8")).toBe(before.job);
    const keyring = loadKeyring(dir);
    expect(keyring.secretKey).toBe(JSON.parse(before.keyring).secretKey);
    expect(keyring.clients.map((c) => c.name)).toEqual(["job-a", "job-b"]);
  });

  it("refuses names unsafe in a file name, host ranges that are not ranges, and a damaged keyring, naming the fix", async () => {
    const dir = tempDir();
    dirs.push(dir);
    expect(await runCli("keys", "--dir", dir, "--job", "../x")).toMatchObject({ code: 2, stderr: expect.stringContaining('--job "../x" names a file') });
    expect(await runCli("keys", "--dir", dir, "--daemon", "5-2")).toMatchObject({
      code: 2,
      stderr: expect.stringContaining("--daemon takes host indices as 3, 0-15 or 0,2,5"),
    });
    writeFileSync(join(dir, "controller.json"), "{}", { mode: 0o600 });
    expect(await runCli("keys", "--dir", dir, "--job", "a")).toMatchObject({
      code: 2,
      stderr: expect.stringContaining(`keyring ${join(dir, "controller.json")} at publicKey`),
    });
  });
});
