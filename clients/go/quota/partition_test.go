package quota

import (
	"encoding/json"
	"strconv"
	"testing"
)

type partitionVector struct {
	Note       string         `json:"note"`
	User       string         `json:"user"`
	FNV1a32    uint32         `json:"fnv1a32"`
	Partitions map[string]int `json:"partitions"`
}

// The vectors (clients/testdata/vectors.json) test/client/partitionVectors.test.ts checks the
// TypeScript client against.
func readPartitionVectors(t *testing.T) []partitionVector {
	t.Helper()
	var file struct {
		Vectors []partitionVector `json:"partitions"`
	}
	decodeVectors(t, &file)
	if len(file.Vectors) < 10 {
		t.Fatalf("only %d vectors", len(file.Vectors))
	}
	return file.Vectors
}

func TestPartitionVectorsSharedWithTypeScript(t *testing.T) {
	for _, vector := range readPartitionVectors(t) {
		vector := vector
		t.Run(vector.Note+"/"+strconv.Quote(vector.User), func(t *testing.T) {
			if got := FNV1a32(vector.User); got != vector.FNV1a32 {
				t.Errorf("FNV1a32(%q) = %d, want %d", vector.User, got, vector.FNV1a32)
			}
			for text, want := range vector.Partitions {
				partitions, err := strconv.Atoi(text)
				if err != nil {
					t.Fatal(err)
				}
				if got := Partition(vector.User, partitions); got != want {
					t.Errorf("Partition(%q, %d) = %d, want %d", vector.User, partitions, got, want)
				}
			}
		})
	}
}

func TestPublishedFNV1aVectors(t *testing.T) {
	for user, want := range map[string]uint32{"": 0x811c9dc5, "a": 0xe40c292c, "foobar": 0xbf9cf968} {
		if got := FNV1a32(user); got != want {
			t.Errorf("FNV1a32(%q) = %#x, want %#x", user, got, want)
		}
	}
	if got := Partition("alice", 64); got != 39 {
		t.Errorf("alice is in partition %d of 64, README says 39", got)
	}
}

// A Go string may hold invalid UTF-8; encoding/json sends each invalid byte as U+FFFD, and the
// coordinator hashes what it receives: the client must hash the same.
func TestPartitionOfInvalidUTF8IsThatOfTheEncodedUser(t *testing.T) {
	for _, user := range []string{"user-\xff", "\xc3(x", "a\xed\xa0\x80b", "\xff\xfe"} {
		encoded, err := json.Marshal(user)
		if err != nil {
			t.Fatal(err)
		}
		var received string
		if err := json.Unmarshal(encoded, &received); err != nil {
			t.Fatal(err)
		}
		if received == user {
			t.Fatalf("%q went through JSON unchanged: not a case of invalid UTF-8", user)
		}
		if FNV1a32(user) != FNV1a32(received) {
			t.Errorf("FNV1a32(%q) = %d, but the coordinator receives %q with hash %d", user, FNV1a32(user), received, FNV1a32(received))
		}
	}
}
