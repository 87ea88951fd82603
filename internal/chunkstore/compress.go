package chunkstore

import (
	"fmt"

	"github.com/klauspost/compress/zstd"

	"space/internal/errkind"
)

// newEncoder returns the encoder Put compresses chunks of chunkSize with,
// or nil if compression (Config.Compression) is "none".
func newEncoder(compression string, chunkSize int64) (*zstd.Encoder, error) {
	switch compression {
	case "", "zstd":
	case "none":
		return nil, nil
	default:
		return nil, fmt.Errorf("chunkstore: compression %q: want \"zstd\" or \"none\": %w", compression, errkind.InvalidArgument)
	}
	enc, err := zstd.NewWriter(nil,
		// Put compresses every new chunk on its way to the backend: speed
		// matters more than the last few percent.
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		// A chunk is one frame, so no match reaches back further than its
		// start: a window of the chunk size loses nothing and bounds the
		// history each encoder keeps.
		zstd.WithWindowSize(int(chunkSize)),
		zstd.WithLowerEncoderMem(true),
		// Restore checks the BLAKE3 digest of every decompressed chunk; a
		// frame checksum would cost 4 bytes a chunk to check less.
		zstd.WithEncoderCRC(false),
	)
	if err != nil {
		return nil, fmt.Errorf("chunkstore: zstd encoder: %w", err)
	}
	return enc, nil
}

// newDecoder returns the decoder Restore decompresses chunks with.
func newDecoder() (*zstd.Decoder, error) {
	dec, err := zstd.NewReader(nil,
		// DecodeAll waits for a free decoder: one per CPU, since Restore
		// decompresses up to Config.Concurrency chunks at once.
		zstd.WithDecoderConcurrency(0),
		// No chunk is larger; a damaged frame that claims more is refused
		// before anything is allocated for it.
		zstd.WithDecoderMaxMemory(MaxChunkSize),
		zstd.WithDecoderMaxWindow(MaxChunkSize),
		// decodeChunk bounds the output by the capacity it passes: the
		// chunk's length.
		zstd.WithDecodeAllCapLimit(true),
	)
	if err != nil {
		return nil, fmt.Errorf("chunkstore: zstd decoder: %w", err)
	}
	return dec, nil
}

// encodeChunk returns the encoding Put stores data in and the bytes to
// store: zstd, compressed into *scratch (which it may grow), if that makes
// the chunk at least an eighth smaller; else data itself, raw. Content that
// does not compress (random or encrypted pages, compressed files) gains
// nothing from zstd but a decompression on every restore.
func (s *Store) encodeChunk(data []byte, scratch *[]byte) (encoding string, stored []byte) {
	if s.zenc == nil {
		return EncodingRaw, data
	}
	*scratch = s.zenc.EncodeAll(data, (*scratch)[:0])
	if !worthCompressing(int64(len(*scratch)), int64(len(data))) {
		return EncodingRaw, data
	}
	return EncodingZstd, *scratch
}

// worthCompressing reports whether packed bytes are at least an eighth
// less than raw ones.
func worthCompressing(packed, raw int64) bool { return 8*packed <= 7*raw }

// otherEncoding returns the encoding that is not e.
func otherEncoding(e string) string {
	if e == EncodingZstd {
		return EncodingRaw
	}
	return EncodingZstd
}

// plausibleSize reports whether an object of size bytes can hold a chunk
// of length bytes in encoding: raw, exactly length; compressed, something
// but no more than length (Put stores a chunk compressed only where that
// makes it smaller, and Restore reads no more). An object that fails this
// is damaged; one that passes may still be, which Restore's digest check
// finds.
func plausibleSize(encoding string, size, length int64) bool {
	if encoding == EncodingZstd {
		return 0 < size && size <= length
	}
	return size == length
}

// decodeChunk decompresses a zstd-encoded chunk of length bytes into dst,
// whose capacity must be at least length. The decoder refuses to produce
// more than length bytes, so a damaged frame cannot make it allocate
// more; any damage it notices, or a wrong length, is ErrCorrupt. (Damage
// it does not notice, Restore's digest check finds.)
func (s *Store) decodeChunk(packed, dst []byte, length int64) (data []byte, err error) {
	// The decoder is fuzzed upstream, but what it reads came from storage:
	// should it panic on some damage, that must fail this chunk, not the
	// process.
	defer func() {
		if r := recover(); r != nil {
			data, err = nil, fmt.Errorf("zstd decoder panicked: %v: %w", r, ErrCorrupt)
		}
	}()
	data, err = s.zdec.DecodeAll(packed, dst[:0:length])
	if err != nil {
		return nil, fmt.Errorf("decompress: %v: %w", err, ErrCorrupt)
	}
	if int64(len(data)) != length {
		return nil, fmt.Errorf("decompresses to %d bytes, want %d: %w", len(data), length, ErrCorrupt)
	}
	return data, nil
}
