// The receiver the performance issue was measured against: Node's http server answering
// every POST with 204 at once (`OUTBOX_RELAY_BENCH_RECEIVER=node`). It counts the POSTs and
// serves the count on `GET /count`, which the bench polls. Prints its port on stdout.
const http = require("http");

let posts = 0;
const server = http.createServer((req, res) => {
  if (req.method === "GET" && req.url === "/count") {
    res.writeHead(200, { "content-type": "text/plain" });
    res.end(String(posts));
    return;
  }
  req.resume();
  req.on("end", () => {
    posts += 1;
    res.writeHead(204);
    res.end();
  });
});
server.keepAliveTimeout = 60000;
server.listen(0, "127.0.0.1", () => {
  console.log(server.address().port);
});
