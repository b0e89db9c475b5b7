#pragma once
// A folder replaced whole or not at all (pulse-sync apply and pull into a model folder).
//
// The new content is written into a fresh folder next to the destination (same parent, so the
// same filesystem: ".<name>.pulse-new.XXXXXX"), every file and folder fsynced, and checked by
// the caller; only then does it take the destination's name:
//  - destination absent: renameat2(RENAME_NOREPLACE), or rename where that flag is unsupported;
//  - destination present: renameat2(RENAME_EXCHANGE) swaps the two folders in one step, and the
//    old content, now under the temporary name, is removed. One atomic step, no window in which
//    the destination is missing or mixed.
//  - Filesystems without RENAME_EXCHANGE (the kernel or filesystem answers EINVAL or ENOSYS:
//    some network and FUSE filesystems) get two renames, old -> ".<name>.pulse-old" and new ->
//    destination, with a marker ".<name>.pulse-swap" written (and fsynced) before the first.
//    A process that dies between them leaves the destination missing and the marker, and the
//    next replace_folder or recover_folder_swap of that destination puts the old folder back.
// Any failure before the swap (a bad patch, a wrong base, a full disk, a kill) leaves the old
// folder exactly as it was; leftovers of killed writers are removed by the next writer. One
// writer per destination at a time.
#include <functional>
#include <string>

namespace pulse::io {

// Writes the new content with fill(folder) into an empty temporary folder and swaps it into
// place as above. On any exception from fill or the swap the temporary folder is removed, the
// destination keeps its old content, and the exception propagates.
void replace_folder(const std::string& destination, const std::function<void(const std::string& folder)>& fill);

// Undoes a two-rename swap of destination that was interrupted (see above): readers call it,
// so a folder left missing is back before they open it. Only a stat when there is nothing to
// do; replace_folder also removes leftover temporary folders of killed writers.
void recover_folder_swap(const std::string& destination);

// fsync of every file and folder under folder, and of folder itself.
void sync_folder_tree(const std::string& folder);

}  // namespace pulse::io
