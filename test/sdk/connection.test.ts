import { afterEach, describe, expect, it } from "vitest";
import { curveKeyPair } from "zeromq";
import { ClientClosedError, ControllerConnection, ControllerError, ControllerTimeoutError } from "../../sdk/client/connection.ts";
import { Dealer } from "zeromq";
import { AuthFrameSchema, sharedSecret, verifyFrame } from "../../sdk/contract/protocol/auth.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import { FakeController, until } from "../helpers/fake-controller.ts";
import { closeControllersAfterEach, startController } from "../service/harness.ts";

closeControllersAfterEach();
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function setup(options: { timeoutMs?: number; retryMs?: number } = {}) {
  const controller = await FakeController.start();
  const messages: Record<string, unknown>[] = [];
  const connection = new ControllerConnection({
    endpoint: controller.endpoint,
    retryMs: options.retryMs ?? 10_000,
    ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
    onMessage: (frame) => messages.push(JSON.parse(frame.toString()) as Record<string, unknown>),
  });
  cleanups.push(
    () => controller.close(),
    () => connection.close(),
  );
  return { controller, connection, messages };
}

describe("controller connection", () => {
  it("matches replies to requests by id, whatever their order", async () => {
    const { controller, connection } = await setup();
    const first = connection.request({ type: "status" });
    const second = connection.request({ type: "job.finish", job: "a" });
    const [a, b] = [await controller.next(), await controller.next()];
    expect(a).toMatchObject({ v: PROTOCOL_VERSION, type: "status" });
    expect(b).toMatchObject({ v: PROTOCOL_VERSION, type: "job.finish", job: "a" });
    await controller.send({ v: PROTOCOL_VERSION, type: "job.finished", id: b.id, job: "a" });
    await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: a.id });
    expect(await second).toEqual({ v: PROTOCOL_VERSION, type: "job.finished", id: b.id, job: "a" });
    expect(await first).toEqual({ v: PROTOCOL_VERSION, type: "ack", id: a.id });
  });

  it("hands commands and unmatched replies to onMessage, even a command carrying a waiting request's id", async () => {
    const { controller, connection, messages } = await setup();
    const waiting = connection.request({ type: "status" });
    const request = await controller.next();
    const command = { v: PROTOCOL_VERSION, type: "daemon.release", id: request.id, token: "t" };
    await controller.send(command);
    connection.send({ type: "daemon.heartbeat", host: 3, incarnation: "0".repeat(32) });
    const heartbeat = await controller.next();
    expect(heartbeat).toMatchObject({ type: "daemon.heartbeat", host: 3 });
    expect(heartbeat.id).not.toBe(request.id);
    await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: heartbeat.id });
    await until(() => messages.length === 2);
    expect(messages).toEqual([command, { v: PROTOCOL_VERSION, type: "ack", id: heartbeat.id }]);
    // The command left the request waiting; its own answer still settles it.
    await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: request.id });
    expect(await waiting).toMatchObject({ type: "ack" });
  });

  it("reads on when onMessage throws: the error is logged, and later replies and commands still arrive", async () => {
    const controller = await FakeController.start();
    const handled: string[] = [];
    const errors: string[] = [];
    const connection = new ControllerConnection({
      endpoint: controller.endpoint,
      retryMs: 10_000,
      onMessage: (frame) => {
        const { token } = JSON.parse(frame.toString()) as { token: string };
        if (token === "bad") throw new Error("staging buffer is busy");
        handled.push(token);
      },
      log: { debug: () => undefined, info: () => undefined, warn: () => undefined, error: (make) => void errors.push(make()) },
    });
    cleanups.push(
      () => controller.close(),
      () => connection.close(),
    );
    const waiting = connection.request({ type: "status" });
    const request = await controller.next();
    await controller.send({ v: PROTOCOL_VERSION, type: "daemon.release", id: 1, token: "bad" });
    await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: request.id });
    expect(await waiting).toMatchObject({ type: "ack" });
    await controller.send({ v: PROTOCOL_VERSION, type: "daemon.release", id: 2, token: "good" });
    await until(() => handled.length === 1);
    expect(handled).toEqual(["good"]);
    expect(errors).toEqual(["a message from the controller could not be handled: staging buffer is busy"]);
  });

  it("answers a command on the same socket", async () => {
    const { controller, connection } = await setup();
    connection.answer({ v: PROTOCOL_VERSION, type: "daemon.done", id: 7, host: 2 });
    expect(await controller.next()).toEqual({ v: PROTOCOL_VERSION, type: "daemon.done", id: 7, host: 2 });
  });

  it("rejects with ControllerError on an error reply, on an answer it cannot read, and on one of another protocol version", async () => {
    const { controller, connection } = await setup();
    const refused = connection.request({ type: "status" });
    await controller.send({ v: PROTOCOL_VERSION, type: "error", id: (await controller.next()).id, code: "unknown_worker", message: "who?" });
    await expect(refused).rejects.toSatisfy((e) => e instanceof ControllerError && e.code === "unknown_worker" && e.message === "who?");
    const garbled = connection.request({ type: "status" });
    await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: (await controller.next()).id, extra: 1 });
    await expect(garbled).rejects.toMatchObject({
      name: "ControllerError",
      code: "malformed",
      message: expect.stringMatching(/^the controller's answer could not be read: ack: unknown field "extra"/),
    });
    const older = connection.request({ type: "status" });
    await controller.send({ v: 1, type: "ack", id: (await controller.next()).id });
    await expect(older).rejects.toMatchObject({
      name: "ControllerError",
      code: "unsupported_version",
      message: `the controller at ${controller.endpoint} speaks another protocol version: protocol version 1 is not supported: this client speaks version 2; run the same MonkeyTree release on the controller, the daemons and the launchers`,
    });
  });

  it("is refused by a controller when it speaks version 1, with an answer naming both versions", async () => {
    const harness = await startController();
    const peer = new Dealer({ linger: 0, receiveTimeout: 5_000 });
    cleanups.push(() => peer.close());
    peer.connect(harness.server.endpoint);
    const refusal = {
      v: PROTOCOL_VERSION,
      type: "error",
      code: "unsupported_version",
      message:
        "protocol version 1 is not supported: this controller speaks version 2; run the same MonkeyTree release on the controller, the daemons and the launchers",
    };
    // A version-1 launcher's status request, and its barrier, which version 2 no longer has.
    await peer.send(JSON.stringify({ v: 1, type: "status", id: 11 }));
    expect(JSON.parse((await peer.receive())[0]!.toString())).toEqual({ ...refusal, id: 11 });
    await peer.send(JSON.stringify({ v: 1, type: "worker.barrier", id: 12, worker: { job: "a", group: 0, host: 0 }, step: 0, generation: 0 }));
    expect(JSON.parse((await peer.receive())[0]!.toString())).toEqual({ ...refusal, id: 12 });
  });

  it("resends an unanswered request with the same id until it is answered", async () => {
    const { controller, connection } = await setup({ retryMs: 20 });
    const answered = connection.request({ type: "status" });
    const first = await controller.next();
    const again = await controller.next();
    expect(again).toEqual(first);
    await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: first.id });
    await answered;
  });

  it("waits without a deadline when timeoutMs is Infinity, until closed", async () => {
    const { controller, connection } = await setup({ timeoutMs: Infinity });
    const waiting = connection.request({ type: "status" });
    await controller.next();
    await connection.close();
    await expect(waiting).rejects.toBeInstanceOf(ClientClosedError);
    await expect(connection.request({ type: "status" })).rejects.toBeInstanceOf(ClientClosedError);
  });

  it("times out naming the request and the endpoint", async () => {
    const { controller, connection } = await setup({ timeoutMs: 50 });
    const error = await connection.request({ type: "status" }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ControllerTimeoutError);
    expect(error).toMatchObject({ request: "status #1", endpoint: controller.endpoint, timeoutMs: 50 });
  });

  it("talks CURVE with its credential's keypair and proves every message with a MAC frame", async () => {
    const server = curveKeyPair();
    const client = curveKeyPair();
    const controller = await FakeController.start(server.secretKey);
    const connection = new ControllerConnection({
      endpoint: controller.endpoint,
      credential: { principal: { role: "operator" }, ...client, serverKey: server.publicKey },
    });
    cleanups.push(
      () => controller.close(),
      () => connection.close(),
    );
    const answered = connection.request({ type: "status" });
    const request = await controller.next();
    const { frame, auth } = controller.last!;
    const proof = AuthFrameSchema.parse(JSON.parse(auth!.toString()));
    expect(proof.key).toBe(client.publicKey);
    expect(verifyFrame(sharedSecret(server, client.publicKey), frame, proof.mac)).toBe(true);
    await controller.send({ v: PROTOCOL_VERSION, type: "ack", id: request.id });
    expect(await answered).toMatchObject({ type: "ack" });
  });
});
