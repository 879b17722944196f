// The browser device (issue 25, ADR 0012): plan → segment (sha256-checked) → onnxruntime-web head
// → quantize and pack the activation (packet.js) → upload → answer, timed phase by phase, as
// client/device.py does it: cut 0 sends the input itself, an all-device plan uploads nothing.
// Live audits (ADR 0024), opted in only (the #audit box, or ?audit=1): the plan request consents,
// the first tail request of a plan the server marked names the audit (Qpart-Audit), and once every
// answer is shown that request's model input goes up as a float32 packet; its outcome never
// changes an answer.
import * as ort from "./vendor/ort.wasm.min.mjs";
import { FLOAT_BITS, encodePacket } from "./packet.js";
import { FASHION_MNIST_SPEC, decodePixels, normalize } from "./preprocess.js";

const MAX_SEGMENT_BYTES = 256 << 20; // kernels.onnx_segment.OnnxSegmentLimits.max_bytes
// The shipped samples' classes (the answers' class names come from the model card, /v2 metadata).
const FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
  "Sneaker", "Bag", "Ankle boot"];
// The first image of each class in the t10k test split (file name: its index there).
const SAMPLES = [[19, 0], [2, 1], [1, 2], [13, 3], [6, 4], [8, 5], [4, 6], [9, 7], [18, 8], [0, 9]];
const PHASES = ["download", "session", "preprocess", "head", "encode", "upload", "server"];
const AUDIT_HEADER = "Qpart-Audit"; // server.schemas.AUDIT_HEADER
const AUDIT_SAMPLE_HEADER = "Qpart-Audit-Sample"; // server.schemas.AUDIT_SAMPLE_HEADER
const NOT_MARKED = "not marked: the server audits none or did not draw this plan"; // client.device.NOT_MARKED

ort.env.wasm.numThreads = 1;
ort.env.wasm.proxy = false;
ort.env.wasm.wasmPaths = new URL("./vendor/", import.meta.url).href;

const sessions = new Map(); // segment id → {session}: the page's segment cache
const cards = new Map(); // model@version → {spec, labels}: what its card declares
const $ = (id) => document.getElementById(id);

function setStatus(state, text) {
  $("status").dataset.state = state;
  $("status").textContent = text;
}

function headers(token, extra = {}) {
  return token ? { ...extra, Authorization: `Bearer ${token}` } : extra;
}

async function call(url, init, what) {
  const response = await fetch(url, init);
  if (!response.ok) {
    let message = await response.text();
    try { message = JSON.parse(message).error ?? message; } catch { /* not the server's JSON body */ }
    throw new Error(`${what}: ${response.status} ${message}`);
  }
  return response;
}

function hex(buffer) {
  return Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** POST /v1/plan for an ONNX head. */
export async function requestPlan(options) {
  const device = options.device.trim().startsWith("{") ? JSON.parse(options.device) : options.device.trim();
  const body = {
    model: options.model, accuracy_demand: options.demand, rate_bps: options.rateMbps * 1e6, device,
    weights: options.weights, runtime: "onnx", batch: 1, held_segments: [...sessions.keys()].slice(-256),
  };
  if (options.audit === true) body.audit = true; // only then: the device consents (ADR 0024)
  const response = await call("/v1/plan", {
    method: "POST", headers: headers(options.token, { "Content-Type": "application/json" }),
    body: JSON.stringify(body),
  }, "plan");
  return auditable(await response.json(), options.audit === true);
}

/** The plan, its audit dropped unless this device consented and the server answers the plan: an
 * input is never uploaded where it was not asked for, nor to another origin than its tail's. */
function auditable(plan, consented) {
  const audit = plan.audit ?? null;
  if (audit === null) return plan;
  const origin = (url) => new URL(url, document.baseURI).origin;
  if (!consented || plan.infer_url === null || origin(audit.url) !== origin(plan.infer_url)) {
    return { ...plan, audit: null };
  }
  return plan;
}

/** What the plan's model card declares, from its /v2 metadata parameters (JSON strings):
 * {spec: the preprocessing, else Fashion-MNIST's; labels: the class names, else null}. */
async function card(plan, token) {
  const key = `${plan.model}@${plan.version}`;
  if (!cards.has(key)) {
    const url = `/v2/models/${encodeURIComponent(plan.model)}/versions/${encodeURIComponent(plan.version)}`;
    const parameters = (await (await call(url, { headers: headers(token) }, "model metadata")).json()).parameters ?? {};
    const declared = (name) => {
      if (parameters[name] === undefined) return null;
      try { return JSON.parse(parameters[name]); } catch { throw new Error(`the model metadata's ${name} is not JSON`); }
    };
    const labels = declared("labels");
    cards.set(key, { spec: { ...FASHION_MNIST_SPEC, ...(declared("preprocess") ?? {}) },
      labels: Array.isArray(labels) ? labels : null });
  }
  return cards.get(key);
}

/** Download, check and load the plan's segment: {run, download_s, session_s, bytes}. */
export async function loadHead(plan, token) {
  const seg = plan.segment;
  if (seg === null) {
    if (plan.cut !== 0) throw new Error(`the plan for cut ${plan.cut} has no segment`);
    return { run: async (x) => x, download_s: 0, session_s: 0, bytes: 0 };
  }
  if (seg.runtime !== "onnx") throw new Error(`the plan links a ${seg.runtime} segment, not an ONNX one`);
  let bytes = 0;
  let downloadS = 0;
  let sessionS = 0;
  if (!sessions.has(seg.id)) {
    if (seg.size_bytes > MAX_SEGMENT_BYTES) throw new Error(`segment of ${seg.size_bytes} bytes is over the cap`);
    if (!globalThis.crypto?.subtle) {
      throw new Error("WebCrypto is unavailable: open this page over https or from localhost to check segments");
    }
    const t0 = performance.now();
    const data = new Uint8Array(await (await call(seg.url, { headers: headers(token) }, "segment")).arrayBuffer());
    // The digest first: nothing reads a segment's bytes before they are known to be the plan's.
    const digest = hex(await crypto.subtle.digest("SHA-256", data));
    if (data.length !== seg.size_bytes || digest !== seg.sha256 || digest !== seg.id) {
      throw new Error(`segment ${seg.id.slice(0, 12)} refused: ${data.length} bytes hashing to ${digest.slice(0, 12)}`);
    }
    const t1 = performance.now();
    const session = await ort.InferenceSession.create(data, {
      executionProviders: ["wasm"], graphOptimizationLevel: "all", intraOpNumThreads: 1, interOpNumThreads: 1,
    });
    if (session.inputNames.join() !== "input" || session.outputNames.join() !== "activation") {
      throw new Error(`segment ${seg.id.slice(0, 12)} refused: it maps ${session.inputNames} to ${session.outputNames}`);
    }
    sessions.set(seg.id, session);
    [bytes, downloadS, sessionS] = [data.length, (t1 - t0) / 1000, (performance.now() - t1) / 1000];
  }
  const session = sessions.get(seg.id);
  const run = async (x) => {
    const out = (await session.run({ input: new ort.Tensor("float32", x.data, x.dims) })).activation;
    return { data: out.data, dims: out.dims };
  };
  return { run, download_s: downloadS, session_s: sessionS, bytes };
}

function argmax(values) {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

/** One image through the plan: its class, top probability and phase seconds. With `auditId`, the
 * tail request names that audit and the answer carries the model input it was for (`audit_input`). */
export async function classify(plan, head, blob, token, auditId = null) {
  const { spec } = await card(plan, token);
  const t0 = performance.now();
  const input = normalize(await decodePixels(blob, spec), spec);
  const x = { data: input.data, dims: [1, ...input.dims] };
  if (plan.cut === 0 && input.dims.join() !== plan.activation_shape.join()) {
    throw new Error(`the image became [${input.dims}], the model takes [${plan.activation_shape}]`);
  }
  const t1 = performance.now();
  const act = await head.run(x);
  const t2 = performance.now();
  const times = { preprocess: (t1 - t0) / 1000, head: (t2 - t1) / 1000 };
  if (plan.infer_url === null) { // all on the device: the head's output is the logits
    const logits = Array.from(act.data);
    const label = argmax(logits);
    const exps = logits.map((v) => Math.exp(v - logits[label]));
    return { label, probability: 1 / exps.reduce((a, b) => a + b, 0), logits, bytes_up: 0, times };
  }
  const packet = encodePacket(act.data, act.dims, plan.activation_bits, plan.group_size);
  const t3 = performance.now();
  const sent = { "Content-Type": "application/octet-stream" };
  if (auditId !== null) sent[AUDIT_HEADER] = auditId;
  const response = await call(plan.infer_url, { method: "POST", body: packet, headers: headers(token, sent) },
    "upload");
  const answer = await response.json();
  const t4 = performance.now();
  const server = answer.queue_s + answer.compute_s;
  Object.assign(times, { encode: (t3 - t2) / 1000, upload: (t4 - t3) / 1000 - server, server });
  const logits = answer.results[0].logits;
  const label = argmax(logits);
  const top = answer.results[0].top_k.find((k) => k.label === label);
  // Outside the timed phases: which packet went up (tests compare it with the kernels' bytes).
  const packetSha256 = hex(await crypto.subtle.digest("SHA-256", packet));
  const result = { label, probability: top ? top.probability : null, logits, bytes_up: packet.length,
    packet_sha256: packetSha256, times };
  if (auditId === null) return result;
  // The answer names which sample its audit checks (Qpart-Audit-Sample); one image a request: 0.
  const sample = response.headers.get(AUDIT_SAMPLE_HEADER);
  return { ...result, audit_input: sample === "0" ? x : null };
}

/** Upload an audited plan's model input `x` ({data, dims}: the one sample the tail answer named in
 * Qpart-Audit-Sample) to its audit URL as a float32 packet: "queued", "dropped" (the server was busy)
 * or "failed: <why>". Never throws: an audit's outcome changes no answer. */
export async function uploadAudit(plan, x, token) {
  try {
    const want = plan.audit.input_shape.join();
    if (x.dims.slice(1).join() !== want) {
      throw new Error(`the input is [${x.dims.slice(1)}], the audit wants [${want}]`);
    }
    const packet = encodePacket(x.data, x.dims, FLOAT_BITS, 0);
    const receipt = await (await call(plan.audit.url, {
      method: "POST", body: packet, headers: headers(token, { "Content-Type": "application/octet-stream" }),
    }, "audit")).json();
    return receipt.queued === true ? "queued" : "dropped";
  } catch (error) {
    return `failed: ${String(error.message ?? error).split("\n")[0].slice(0, 200)}`;
  }
}

function ms(seconds) {
  return seconds === undefined ? "—" : (seconds * 1000).toFixed(2);
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    td.textContent = String(cell);
    tr.append(td);
  }
  return tr;
}

function showPlan(plan, head) {
  const items = {
    plan: plan.plan_id, cut: `${plan.cut} of ${plan.cuts} (${plan.cut_node})`, level: plan.level,
    "activation bits": `${plan.activation_bits} (group ${plan.group_size})`,
    segment: plan.segment ? `${plan.segment.size_bytes} bytes, downloaded ${head.bytes}` : "none",
    upload: plan.infer_url ?? "none: all on the device",
  };
  $("plan").replaceChildren(...Object.entries(items).flatMap(([k, v]) => {
    const [dt, dd] = [document.createElement("dt"), document.createElement("dd")];
    [dt.textContent, dd.textContent] = [k, String(v)];
    return [dt, dd];
  }));
}

function showPhases(run) {
  const body = $("phases").tBodies[0];
  body.replaceChildren(...PHASES.map((phase) => {
    const values = phase === "download" || phase === "session" ? [run[`${phase}_s`]]
      : run.results.map((r) => r.times[phase]).filter((v) => v !== undefined);
    const tr = values.length ? row([phase, ms(median(values)), ms(values.reduce((a, b) => a + b, 0))])
      : row([phase, "—", "—"]);
    tr.dataset.phase = phase;
    return tr;
  }));
}

async function labelName(plan, label, token) {
  return (await card(plan, token)).labels?.[label] ?? "";
}

async function images() {
  const files = [...$("files").files];
  if (files.length) return files.map((f) => ({ name: f.name, blob: f }));
  const sample = $("sample").value;
  if (!sample) throw new Error("choose image files or a shipped sample");
  return [{ name: sample, blob: await (await call(`samples/${sample}`, {}, "sample")).blob() }];
}

let runs = 0; // which run an audit's outcome belongs to (a later run's status is not overwritten)

function showAudit(state, text) {
  $("audit-status").dataset.state = state;
  $("audit-status").textContent = text;
  $("audit-status").hidden = state === "off";
}

async function audit(plan, x, token, run, which) {
  showAudit("uploading", "audit: uploading the first image's input…");
  const outcome = await uploadAudit(plan, x, token);
  run.audit = outcome;
  if (which === runs) showAudit(outcome.split(":")[0], `audit: ${outcome}`);
}

async function runForm(event) {
  event.preventDefault();
  $("run").disabled = true;
  const which = ++runs;
  showAudit("off", "");
  setStatus("running", "Planning…");
  try {
    const token = $("token").value.trim();
    const inputs = await images();
    const t0 = performance.now();
    const consented = $("audit").checked;
    const plan = await requestPlan({
      model: $("model").value.trim(), demand: Number($("demand").value), rateMbps: Number($("rate").value),
      device: $("device").value, weights: $("weights").value, token, audit: consented,
    });
    const planS = (performance.now() - t0) / 1000;
    setStatus("running", `Plan: cut ${plan.cut}; loading the head…`);
    const head = await loadHead(plan, token);
    const run = { plan, isolated: globalThis.crossOriginIsolated === true, plan_s: planS, download_s: head.download_s, session_s: head.session_s,
      downloaded_bytes: head.bytes, results: [],
      audit: plan.audit ? "pending" : consented ? NOT_MARKED : null };
    let audited = null; // the model input of the sample the plan's audit checks
    let asked = false; // a tail request named the audit
    showPlan(plan, head);
    $("plan-section").hidden = false;
    const tbody = $("results").tBodies[0];
    tbody.replaceChildren();
    for (const [i, image] of inputs.entries()) {
      setStatus("running", `Image ${i + 1} of ${inputs.length}…`);
      const auditId = plan.audit && !asked ? plan.audit.id : null;
      const { audit_input: input, ...answer } = await classify(plan, head, image.blob, token, auditId);
      if (auditId !== null) [asked, audited] = [true, input];
      const result = { name: image.name, ...answer };
      run.results.push(result);
      const t = result.times;
      result.class_name = await labelName(plan, result.label, token);
      tbody.append(row([i + 1, image.name, result.label, result.class_name,
        result.probability === null ? "—" : result.probability.toFixed(3), result.bytes_up,
        ms(t.head), ms(t.encode), ms(t.upload), ms(t.server)]));
    }
    showPhases(run);
    window.qpartLastRun = run;
    setStatus("done", `Done: ${inputs.length} image(s), cut ${plan.cut}, ${plan.activation_bits}-bit activation.`);
    if (audited !== null) audit(plan, audited, token, run, which); // after every answer, not awaited
    else if (asked) {
      run.audit = "failed: the tail answer named no sample to audit";
      showAudit("failed", `audit: ${run.audit}`);
    }
  } catch (error) {
    setStatus("error", `Error: ${error.message}`);
  } finally {
    $("run").disabled = false;
  }
}

for (const [index, label] of SAMPLES) {
  const option = document.createElement("option");
  option.value = `t10k-${String(index).padStart(5, "0")}.png`;
  option.textContent = `${FASHION_MNIST_CLASSES[label]} (t10k #${index})`;
  $("sample").append(option);
}
$("sample").value = $("sample").options[1].value;
$("audit").checked = new URLSearchParams(location.search).get("audit") === "1"; // opted in by the link
$("form").addEventListener("submit", runForm);
// Drop the downloaded segments and their sessions: the next run downloads again (bench.micro.browser_device).
window.qpartForgetSegments = () => { for (const session of sessions.values()) session.release(); sessions.clear(); };
// Timers are coarsened to 100 us unless the page is cross-origin isolated (the server sends COOP/COEP).
const timers = globalThis.crossOriginIsolated ? "5 us timers" : "100 us timers";
setStatus("ready", `Ready: onnxruntime-web ${ort.env.versions?.web ?? ""}, WASM, one thread, ${timers}.`);
