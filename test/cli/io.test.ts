import { describe, expect, it } from "vitest";
import { intFlag, isZmqAddress, UsageError } from "../../cli/io.ts";
import { runCli } from "../helpers/cli.ts";

const usage = (f: () => unknown): string => {
  try {
    f();
  } catch (error) {
    if (error instanceof UsageError) return error.message;
    throw error;
  }
  throw new Error("no UsageError");
};

describe("intFlag", () => {
  it("takes whole numbers within the range, and the default when the flag is absent", () => {
    expect(intFlag("host", "3", 0, 0)).toBe(3);
    expect(intFlag("host", "0", 7, 0)).toBe(0);
    expect(intFlag("host", undefined, 7, 0)).toBe(7);
    expect(intFlag("port", "65535", 1, 1, 65535)).toBe(65535);
  });

  it("refuses anything else, naming the flag and the allowed range", () => {
    expect(usage(() => intFlag("steps", "1", 40, 2))).toMatchInlineSnapshot(`"--steps must be a whole number ≥ 2, got "1""`);
    expect(usage(() => intFlag("steps", "2.5", 40, 2))).toMatchInlineSnapshot(`"--steps must be a whole number ≥ 2, got "2.5""`);
    expect(usage(() => intFlag("steps", "ten", 40, 2))).toMatchInlineSnapshot(`"--steps must be a whole number ≥ 2, got "ten""`);
    expect(usage(() => intFlag("steps", "", 40, 0))).toMatchInlineSnapshot(`"--steps must be a whole number ≥ 0, got """`);
    expect(usage(() => intFlag("port", "70000", 1, 1, 65535))).toMatchInlineSnapshot(`"--port must be a whole number from 1 to 65535, got "70000""`);
    expect(usage(() => intFlag("dp", undefined, undefined, 1))).toMatchInlineSnapshot(`"--dp is required"`);
  });

  it("is what every command's whole-number flags go through", async () => {
    const cases: [string[], string][] = [
      [
        ["daemon", "--host", "1.5"],
        `--host must be a whole number ≥ 0 or, with a topology (--topology FILE, or "topology" in the site configuration $MONKEYTREE_CONFIG), a host's name; got "1.5"`,
      ],
      [["daemon", "--host", "0", "--staging-bytes", "0"], `--staging-bytes must be a whole number ≥ 1, got "0"`],
      [["controller", "--stop-lead=-1"], `--stop-lead must be a whole number ≥ 0, got "-1"`],
      [["demo", "--step-ms", "0.5"], `--step-ms must be a whole number ≥ 0, got "0.5"`],
      [["launch", "--job", "a", "--host", "0", "--dp", "0", "--", "torchrun", "t.py"], `--dp must be a whole number ≥ 1, got "0"`],
      [
        ["launch", "--job", "a", "--host", "0", "--dp", "1", "--master-port", "70000", "--", "torchrun", "t.py"],
        `--master-port must be a whole number from 1024 to 65535, got "70000"`,
      ],
    ];
    for (const [argv, message] of cases) expect(await runCli(...argv)).toMatchObject({ code: 2, stderr: expect.stringContaining(message) });
  });
});

describe("isZmqAddress", () => {
  it("takes TCP, Unix socket and in-process addresses, and any free port only to bind", () => {
    for (const address of ["tcp://127.0.0.1:5555", "tcp://controller:1", "tcp://[::1]:5555", "ipc:///run/monkeytree.sock", "inproc://controller"]) {
      expect([isZmqAddress(address, "connect"), isZmqAddress(address, "bind")], address).toEqual([true, true]);
    }
    for (const address of ["tcp://*:0", "tcp://*:5555", "tcp://127.0.0.1:*", "tcp://eth0:0"]) {
      expect([isZmqAddress(address, "connect"), isZmqAddress(address, "bind")], address).toEqual([false, true]);
    }
  });

  it("refuses what ZeroMQ calls an invalid argument, or cannot reach", () => {
    for (const address of [
      "garbage",
      "",
      "tcp://controller",
      "tcp://controller:",
      "tcp://:5555",
      "tcp://h:65536",
      "tcp://h:5555/x",
      "http://h:80",
      "ipc://",
      "tcp://h h:1",
    ]) {
      expect([isZmqAddress(address, "connect"), isZmqAddress(address, "bind")], address).toEqual([false, false]);
    }
  });
});
