//! The streamed forms of the List calls (KEP-5825, `CRIListStreaming`):
//! the same items as the List call with the same filter, cut into
//! responses of at least one item each, every item in exactly one, then the
//! end of the stream. A List answer can outgrow the client's message limit
//! (kubelet's is 16 MiB, tonic's default 4 MiB); no batch here exceeds
//! `BATCH_BYTES` (1 MiB) unless one item alone does.

use prost::Message;

/// Most items in one response.
pub(crate) const BATCH_ITEMS: usize = 5000;

/// Most encoded bytes of the items of one response (a single larger item
/// still goes, alone).
pub(crate) const BATCH_BYTES: usize = 1 << 20;

/// Cuts `items` into batches of at most [`BATCH_ITEMS`] items and
/// [`BATCH_BYTES`] encoded bytes each, in order; none is empty, and no
/// items means no batches.
pub(crate) fn batches<T: Message>(items: Vec<T>) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut bytes = 0;
    for item in items {
        // The item's field tag and length prefix in the response message.
        let len = item.encoded_len();
        let size = len + prost::length_delimiter_len(len) + 1;
        if !batch.is_empty() && (batch.len() == BATCH_ITEMS || bytes + size > BATCH_BYTES) {
            out.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        bytes += size;
        batch.push(item);
    }
    if !batch.is_empty() {
        out.push(batch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_cri::api;

    fn container(id: usize, label_bytes: usize) -> api::Container {
        api::Container {
            id: format!("c{id}"),
            labels: [("l".to_string(), "x".repeat(label_bytes))].into(),
            ..Default::default()
        }
    }

    fn ids(b: &[Vec<api::Container>]) -> Vec<String> {
        b.iter().flatten().map(|c| c.id.clone()).collect()
    }

    #[test]
    fn batches_should_send_nothing_for_no_items() {
        assert!(batches(Vec::<api::Container>::new()).is_empty());
    }

    #[test]
    fn batches_should_cut_by_count_keeping_every_item_once_in_order() {
        let items: Vec<_> = (0..BATCH_ITEMS * 2 + 1).map(|i| container(i, 0)).collect();
        let want: Vec<_> = items.iter().map(|c| c.id.clone()).collect();
        let b = batches(items);
        assert_eq!(
            b.iter().map(Vec::len).collect::<Vec<_>>(),
            [BATCH_ITEMS, BATCH_ITEMS, 1]
        );
        assert_eq!(ids(&b), want);
    }

    #[test]
    fn batches_should_cut_by_encoded_size_and_send_an_oversized_item_alone() {
        let items = vec![
            container(0, BATCH_BYTES / 3),
            container(1, BATCH_BYTES / 3),
            container(2, BATCH_BYTES / 3),
            container(3, BATCH_BYTES * 2),
            container(4, 10),
        ];
        let b = batches(items);
        assert_eq!(b.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1, 1, 1]);
        assert_eq!(ids(&b), ["c0", "c1", "c2", "c3", "c4"]);
        for batch in &b[..2] {
            let msg = api::StreamContainersResponse {
                containers: batch.clone(),
            };
            assert!(msg.encoded_len() <= BATCH_BYTES);
        }
    }
}
