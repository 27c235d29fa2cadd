// The railgrid dashboard's one script (CSP: scripts from the hub only, none inline).
// A job's page: each <pre data-stream> grows with what the hub holds of that stream,
// from the offset it has shown, until the hub says the job is done and nothing is left.
"use strict";

function follow(pre) {
  const url = pre.dataset.stream;
  // One decoder for the whole stream: a character split across two slices is whole.
  const decoder = new TextDecoder();
  let offset = 0;
  const step = async () => {
    let done = false;
    try {
      const resp = await fetch(url + "?offset=" + offset, { credentials: "same-origin" });
      if (resp.ok) {
        const text = decoder.decode(new Uint8Array(await resp.arrayBuffer()), { stream: true });
        if (text.length > 0) {
          pre.textContent += text;
          pre.scrollTop = pre.scrollHeight;
        }
        offset = Number(resp.headers.get("X-Next-Offset") || offset);
        done = resp.headers.get("X-Complete") === "true";
      } else if (resp.status === 401) {
        window.location = "/ui/login";
        return;
      }
    } catch (e) {
      // The hub away for a moment: the next step tries again.
    }
    if (done) {
      pre.dataset.complete = "true";
      const state = document.getElementById("state");
      if (state && state.dataset.refresh === "true") {
        window.location.reload();
      }
      return;
    }
    setTimeout(step, 1000);
  };
  step();
}

document.querySelectorAll("pre[data-stream]").forEach(follow);
