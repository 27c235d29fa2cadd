//! Jobs' output: what an agent uploads, and what `job logs` reads back.

use super::*;

/// A slice of a job's stream, for `job logs`.
pub struct OutputSlice {
    pub bytes: Vec<u8>,
    pub next: u64,
    /// The job is done and nothing is kept past `next`.
    pub complete: bool,
}

/// The agent's upload, checked: the job, its stream and the offset.
pub struct Upload {
    pub job: String,
    pub stream: Stream,
    pub offset: u64,
}

impl<S: Store> Fleet<S> {
    /// Up to `limit` bytes of a job's stream from `offset`.
    pub async fn job_output(
        &self,
        id: &str,
        stream: Stream,
        offset: u64,
        limit: usize,
    ) -> Result<OutputSlice, FleetError> {
        // The state first: if the job was done then, the bytes read after are all.
        let v = self.job(id).await?;
        let stored = match stream {
            Stream::Stdout => v.stdout_stored,
            Stream::Stderr => v.stderr_stored,
        };
        if offset > stored && v.done {
            return Err(FleetError::BadSetting {
                field: "offset".into(),
                why: format!(
                    "{offset} is past the {stored} bytes of {} the hub holds for job {}",
                    stream.name(),
                    util::clip(id)
                ),
            });
        }
        let bytes = self.store.read_output(id, stream, offset, limit).await?;
        let next = offset + bytes.len() as u64;
        Ok(OutputSlice {
            complete: v.done && next == stored,
            bytes,
            next,
        })
    }

    /// Checks that `token` is the token of the agent that runs `upload.job`. An unknown
    /// job reads as a wrong token: an upload names nothing a caller without the token
    /// learns about.
    pub async fn authorize_upload(&self, upload: &Upload, token: &str) -> Result<(), FleetError> {
        let refused = || FleetError::JobToken(util::clip(&upload.job).into_owned());
        let agent = match self.jobs.agent_of(&upload.job) {
            Some(e) => e.id.clone(),
            None => match self.store.job_agent(&upload.job).await? {
                Some(agent) => agent,
                None => return Err(refused()),
            },
        };
        match self.authorize(&agent, token) {
            Ok(_) => Ok(()),
            Err(FleetError::Revoked(a)) => Err(FleetError::Revoked(a)),
            Err(_) => Err(refused()),
        }
    }

    /// Takes an agent's upload (authorised first): the stream's acknowledged length.
    pub async fn upload(&self, upload: &Upload, data: Bytes) -> Result<Appended, FleetError> {
        let n = data.len();
        let r = self
            .store
            .append_output(
                &upload.job,
                upload.stream,
                upload.offset,
                data,
                self.jobs.limits.max_output,
            )
            .await?;
        if n > 0 {
            self.jobs.moved();
        }
        Ok(r)
    }
}
