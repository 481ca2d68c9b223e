// Try it: the dashboard's one script. Sends the request through treg's own call surface with the
// session cookie (sent by the browser, same origin) and the session's CSRF token, which treg requires
// beside the cookie. treg removes the cookie before relaying, so the upstream never sees it.
(function () {
  "use strict";
  var form = document.getElementById("try-form");
  if (!form) { return; }
  var el = function (id) { return document.getElementById(id); };
  function sync() {
    var catalog = el("try-surface").value === "catalog";
    el("try-tool").disabled = catalog;
    el("try-endpoint").disabled = !catalog;
  }
  el("try-surface").addEventListener("change", sync);
  sync();
  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var catalog = el("try-surface").value === "catalog";
    var path = el("try-path").value.trim();
    var url;
    if (catalog) {
      url = "/catalog/call/" + encodeURIComponent(el("try-endpoint").value) + (path.charAt(0) === "?" ? path : "");
    } else {
      if (path && path.charAt(0) !== "/" && path.charAt(0) !== "?") { path = "/" + path; }
      url = "/call/" + encodeURIComponent(el("try-tool").value) + (path || "/");
    }
    var method = el("try-method").value;
    var init = {method: method, credentials: "same-origin", redirect: "manual",
                headers: {"X-Treg-CSRF": form.getAttribute("data-csrf")}};
    if (method !== "GET" && el("try-body").value) {
      init.body = el("try-body").value;
      init.headers["Content-Type"] = el("try-ctype").value || "application/octet-stream";
    }
    el("try-status").textContent = "Sending " + method + " " + url + " …";
    el("try-permalink").textContent = "";
    fetch(url, init).then(function (resp) {
      var lines = [];
      resp.headers.forEach(function (v, k) { lines.push(k + ": " + v); });
      el("try-headers").textContent = lines.join("\n");
      var id = resp.headers.get("X-Treg-Call-Id");
      el("try-status").textContent = "Status " + resp.status + (resp.headers.get("X-Treg-Error") ? " (refused by treg)" : "");
      if (id) {
        var a = document.createElement("a");
        a.href = "/ui/activity/" + encodeURIComponent(id);
        a.textContent = "Open call " + id + " in Activity";
        el("try-permalink").appendChild(a);
      }
      return resp.text();
    }).then(function (text) {
      el("try-answer").textContent = text;
    }).catch(function (err) {
      el("try-status").textContent = "The request failed: " + err;
    });
  });
}());
