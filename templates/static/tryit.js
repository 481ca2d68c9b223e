// Try it: the page works without this script (the form posts to treg, which runs the call and shows
// the answer); the script only greys out the field the chosen surface does not use.
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
}());
