//! What each path answers: `/metrics` in the format and encoding the headers negotiate, of the
//! collectors enabled that the query keeps; `/healthz`; `/api/v1/snapshot` when it is on; a short
//! index at `/`; 404 elsewhere and 405 for methods other than GET and HEAD.

use std::sync::Arc;

use hvstats_present::collectors::{self, Selection};
use hyper::Method;

use crate::Exporter;
use crate::answers::{Answers, Scrape, Want};
use crate::bounds::Bounds;
use crate::http::{Asked, Handler, Reply};
use crate::negotiate;

/// The handler of a server exporting `exporter`, its bodies counted against `bounds`.
pub(crate) fn handler(exporter: Exporter, bounds: Arc<Bounds>) -> Handler {
    let Exporter { live, max_vps, snapshot_api, collectors } = exporter;
    let answers = Answers::new(live, max_vps, bounds);
    Arc::new(move |asked| Box::pin(answer(Arc::clone(&answers), snapshot_api, collectors, asked)))
}

/// The answer to `asked`: the cheap ones at once, the others from the next reading.
async fn answer(answers: Arc<Answers>, snapshot_api: bool, enabled: Selection, asked: Asked) -> Reply {
    if !matches!(asked.method, Method::GET | Method::HEAD) {
        return Reply::text(405, "only GET and HEAD\n");
    }
    match want(&asked, snapshot_api, enabled) {
        Ok(want) => answers.answer(want).await,
        Err(reply) => reply,
    }
}

/// What a reading must give for `asked`, or the reply that needs none.
fn want(asked: &Asked, snapshot_api: bool, enabled: Selection) -> Result<Want, Reply> {
    match asked.path.as_str() {
        "/metrics" => match collectors::selection_of(&asked.query, enabled) {
            Ok(selection) => Ok(Want::Metrics(Scrape {
                format: negotiate::format(&asked.accept),
                selection,
                gzip: negotiate::gzip(&asked.accept_encoding),
            })),
            Err(e) => Err(Reply::text(400, format!("{e}\n"))),
        },
        "/healthz" => Ok(Want::Health),
        "/api/v1/snapshot" if snapshot_api => Ok(Want::Snapshot),
        "/api/v1/snapshot" => {
            Err(Reply::text(404, "the snapshot API is off (hvstats serve --snapshot-api turns it on)\n"))
        }
        "/" => {
            let snapshot = if snapshot_api { " /api/v1/snapshot" } else { "" };
            Err(Reply::text(
                200,
                format!("hvstats exporter: /metrics /healthz{snapshot}\ncollectors: {enabled}\n"),
            ))
        }
        _ => Err(Reply::text(404, "not found: try /metrics\n")),
    }
}
