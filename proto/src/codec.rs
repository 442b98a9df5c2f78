//! The gRPC codec of hark's services: prost's, except that a request that is not a valid message
//! (a string that is not UTF-8, a truncated field) is the caller's mistake, `INVALID_ARGUMENT`,
//! not an `INTERNAL` failure of the server.

use prost::Message;
use tonic::{
    Code, Status,
    codec::{BufferSettings, Codec, DecodeBuf, Decoder},
};
use tonic_prost::{ProstCodec, ProstDecoder};

/// [`ProstCodec`] with decode errors reported as `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct HarkCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for HarkCodec<T, U> {
    fn default() -> Self {
        Self(ProstCodec::default())
    }
}

impl<T, U> Codec for HarkCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = HarkDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        HarkDecoder(self.0.decoder())
    }
}

/// Decodes with prost; a message that does not decode is an invalid argument.
#[derive(Debug)]
pub struct HarkDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default> Decoder for HarkDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            if status.code() == Code::Internal {
                Status::invalid_argument(format!(
                    "the message is not a valid {}: {}",
                    std::any::type_name::<U>()
                        .rsplit("::")
                        .next()
                        .unwrap_or("message"),
                    status.message()
                ))
            } else {
                status
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
